"""Names vulture (`make lint`) reports as unused that are used, by someone it cannot see.

Each line names one; the comment says who uses it. Add a name here only with that reason: a name that
no one uses is deleted, not listed. (This file is read by vulture, never imported.)
"""

# Attributes set on library objects, read by the library: zipfile/tarfile entries, nbformat cells,
# inspect's signature, jupyter_client's kernel manager.
_.__signature__  # inspect.signature reads it (labkit/checks.py)
_.execution_count  # nbformat's cell field (labkit/course/authoring.py)
_.gname  # tarfile.TarInfo (labkit/course/release.py)
_.mtime  # tarfile.TarInfo (labkit/course/release.py)
_.compress_type  # zipfile.ZipInfo (gradescope.py, scoreboard.py)
_.ip  # jupyter_client's KernelManager (labkit/run/kernelmanager.py)
_.transport  # jupyter_client's KernelManager
_.connection_file  # jupyter_client's KernelManager
_.pgid  # jupyter_client's provisioner
_._async_launch_kernel  # overrides jupyter_client's KernelManager method
_.execute_managed_notebook  # overrides nbclient/papermill's engine method
_.default_venv_backend  # nox.options (noxfile.py)
_.assert_allclose  # an adversarial notebook patches numpy.testing (tests/kit/adversarial)
_.assert_equal  # the same

# Hooks and methods a framework calls by name: pytest, pytest-xdist, http.server, html.parser.
_.pytest_generate_tests  # pytest plugin hooks (labkit/judge/judge.py)
_.pytest_configure
_.pytest_collectreport
_.pytest_collection_finish
_.pytest_runtest_makereport
pytest_configure  # tests/kit/conftest.py
one_compile_cache  # an autouse pytest fixture (tests/kit/conftest.py)
compiles_shared_between_workers  # an autouse pytest fixture (tests/kit/conftest.py)
pytest_collection_modifyitems
pytest_xdist_make_scheduler
pytest_runtest_setup  # tests/kit/conftest.py: each test's CPU seconds
pytest_runtest_logreport
pytest_terminal_summary
pytest_unconfigure
_._split_scope  # xdist's LoadFileScheduling
pytestmark  # pytest reads a test module's marks
_.do_GET  # http.server.BaseHTTPRequestHandler (tests/kit/test_canvas.py)
_.do_POST
_.do_PUT
_.log_message
_.handle_starttag  # html.parser.HTMLParser (tests/kit/test_scoreboard.py)
_.handle_endtag
_.handle_data

# Fields of records (msgspec Structs, dataclasses) that arrive from or go to JSON by name.
fully_addressable  # labkit/judge/plaindata.py Sharding
argument  # labkit/judge/records.py
unverified  # labkit/judge/records.py
products  # labkit/judge/records.py
coords  # a fake JAX device's fields (tests/kit/test_lab_1.py)
core_on_chip
slice_index

# Used where vulture does not look: notebooks, nox, the kit's call by name.
Checker  # every lab notebook's first cell: check = Checker(N) (labkit/notebook.py)
slurm_grade  # nox sessions (noxfile.py): nox calls them by name
student_notebooks
other_jax
bench
shard_map_double  # the examined function of each adversarial notebook (tests/kit/adversarial)
leave_distributed  # the kit's last cell of a multi-process run calls it, a string (labkit/run/execute.py LEAVE_CELL)
CHECK_REPLAY  # labkit/envnames.py: notebook.py's variable, which it still spells as a literal (test_envnames.NOT_YET)
tbstyle  # pytest reads config.option.tbstyle when it formats a failure (labkit/judge/judge.py sets it)
max_points  # a field of rows.ScoreRow, a TypedDict: read and written by key
tpu_refused  # a field of callplan.CallSpec, a TypedDict: written by key in judge.verify._launch
_ipython_display_  # IPython calls it to display a value (labkit/notebook.py Checked: Jupyter shows nothing for check's verdict)
_.print_metadata  # jaxlib's HloPrintOptions: labkit/judge/hlo.py's printed() sets them for XLA's printer
_.print_backend_config
