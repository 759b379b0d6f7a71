"""Stand-ins for gcloud, terraform and nox that record every call and answer from a canned file.

Each is this script under the tool's name, first on the PATH. Where they write and what they read come
from FAKE_LOG (a JSON line per call), FAKE_CANNED (terraform's outputs, the state of each TPU VM, each
slice's host count, what a list finds left after a destroy) and FAKE_REMOTE (a folder standing in for
the VMs' disks and the backup bucket); `install` writes them with those settings inside, so that the
commands under test run with no variable of their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

FAKE = r"""
import json, os, shutil, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")
canned = json.load(open(os.environ["FAKE_CANNED"]))
remote = os.environ["FAKE_REMOTE"]
if tool == "terraform":
    action = [a for a in args if not a.startswith("-")][0]
    if action in canned.get("fail", []):
        print(f"terraform {action}: Error: something went wrong", file=sys.stderr)
        sys.exit(1)
    if action == "output":
        value = canned["outputs"].get(args[-1])
        if value is None:
            sys.exit(1)
        print(value if "-raw" in args else json.dumps(value))
    else:
        print("terraform " + " ".join(a for a in args if not a.startswith("-chdir")) + ": done")
elif tool == "gcloud":
    if "list" in args:
        fmt = args[args.index("--format") + 1] if "--format" in args else ""
        kind = {"tpu-vm": "tpus", "queued-resources": "queued", "buckets": "buckets"}.get(args[2], args[1])
        if kind == "tpus" and "state" in fmt:
            print("\n".join(f"{n}\t{s}" for n, s in canned.get("states", {}).items()))
        elif kind == "queued" and "state" in fmt:
            print("\n".join(f"{n}\t{s}" for n, s in canned.get("queued_states", {}).items()))
        else:
            print(canned.get("left", {}).get(kind, ""))
    elif "describe" in args:
        print(canned.get("hosts", {}).get(args[args.index("describe") + 1], 1))
    elif "delete" in args:
        pass
    elif "scp" in args:
        sources = [a for a in args[:-1] if ":" in a and not a.startswith("-")]
        missing = 0
        for src in sources:
            vm, path = src.split(":", 1)
            there = os.path.join(remote, vm, path.lstrip("/"))
            if os.path.isdir(there):
                shutil.copytree(there, os.path.join(args[-1], os.path.basename(path)), dirs_exist_ok=True)
            elif os.path.isfile(there):
                shutil.copy(there, args[-1])
            else:
                print(f"scp: {path}: No such file or directory", file=sys.stderr)
                missing += 1
        sys.exit(1 if missing else 0)
    elif args[:2] == ["storage", "rsync"]:
        src, dst = [a for a in args if not a.startswith("-")][-2:]
        there = os.path.join(remote, "bucket", src.replace("gs://", ""))
        if not os.path.isdir(there):
            sys.exit(1)
        shutil.copytree(there, dst, dirs_exist_ok=True)
    elif "ssh" in args:
        sys.stdin.read()  # as ssh does: whatever the script left on standard input is gone
        name = args[args.index("ssh") + 1]
        print(canned.get("ssh", {}).get(name, "ready"))
elif tool == "nox":
    print("nox " + " ".join(args))
"""


def install(bin_dir: Path, tools: tuple[str, ...], log: Path, canned: Path, remote: Path) -> None:
    """The stand-ins for `tools` in `bin_dir`, their settings written into them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    settings = {"FAKE_LOG": str(log), "FAKE_CANNED": str(canned), "FAKE_REMOTE": str(remote)}
    for tool in tools:
        (bin_dir / tool).write_text(f"#!{sys.executable}\nimport os\nos.environ.update({settings!r})\n{FAKE}")
        (bin_dir / tool).chmod(0o755)
