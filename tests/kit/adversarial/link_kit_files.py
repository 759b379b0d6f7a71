# Aims links at a classmate's notebook and at a Python start-up file: every file the kit's own process writes or reads (papermill's copy, the log, the notebook to run, the calls), both in its scratch folder and in the folder above it, is replaced by a link, and some by a dangling one, left for the next grading of this folder.
# ruff: noqa
import os

here = os.getcwd()
classmate = os.path.join(here, "..", "..", "classmate.ipynb")
startup = os.path.join(here, "..", "..", "planted.pth")  # does not exist: a dangling link
done = []
for folder in (here, os.path.dirname(here)):
    for name, target in (
        ("executed.ipynb", classmate),
        ("input.ipynb", classmate),
        ("calls.json", classmate),
        ("run.log", startup),
        ("kernel.json", startup),
        ("results.json", classmate),
    ):
        path = os.path.join(folder, name)
        try:
            if os.path.lexists(path):
                os.replace(path, path + ".moved")
            os.symlink(target, path)
            done.append(path)
        except OSError:
            pass
print("links made:", done)
