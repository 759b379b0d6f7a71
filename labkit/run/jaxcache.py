"""JAX's persistent compilation cache, shared the one way that carries nothing between students.

Most of a short run's own work is compiling small programs, the same ones in every student's
run of a lab. When grading, the reference solutions run first and fill a cache folder
(`OUT/.jax-cache`); every student's run then reads it and writes nothing: the folder is bound
read-only into the run's sandbox, so no run can leave an entry another run would load. What a
student's run can take from it is an entry named by the hash of a program it compiles itself
(the folder may be passed through, never listed), so it learns nothing it did not already have.
In the student loop (`make lab-N`) the cache is the student's own (`build/.jax-cache`, or the
folder `LABKIT_COMPILE_CACHE_DIR` names), written by their own runs.

A cache entry is XLA's executable for exactly that program, those options and that device count;
a run that misses compiles as before.

On a compile-only TPU configuration the verifier keeps the TPU compiler's facts of each program in
`tpu-facts/` of the same folder, under the same rule (`judge.tpucompile.FactsCache`): written by the runs
that fill the cache, read by name by the others, so a student's program the reference compiled for the
topology is not compiled again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from labkit import envnames

# Cache every program, however small or quick to compile: the labs' programs all are.
SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
# A run that may not write the cache would otherwise print a warning for each program it misses.
QUIET = (
    "import warnings; warnings.filterwarnings('ignore', message='Error writing persistent compilation cache')"
)


TPU_FACTS = "tpu-facts"  # the TPU compiler's facts of each program (judge.tpucompile), beside JAX's entries


@dataclass(frozen=True)
class CompileCache:
    folder: Path
    writable: bool  # True for the runs that fill it (the reference solutions; a student's own loop)

    def environment(self) -> dict[str, str]:
        return SETTINGS | {
            "JAX_COMPILATION_CACHE_DIR": str(self.folder),
            envnames.TPU_CACHE: str(self.folder / TPU_FACTS),
        }

    def read_only(self) -> CompileCache:
        return CompileCache(self.folder, False)

    def binds(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(read-only, writable) folders a sandboxed run that uses this cache must see: the folder, in one of them."""
        return ((), (str(self.folder),)) if self.writable else ((str(self.folder),), ())


def prepare(folder: Path, unlisted: bool = False) -> CompileCache:
    """The cache folder, made if missing.

    `unlisted` (grading): while the runs go on, entries may be added and opened by name, and the
    folder listed by nobody but root; `release` gives it back its usual mode (so that it can be
    removed like any folder). A student's own cache in `make lab-N` is an ordinary folder.
    """
    folder = Path(folder)
    (folder / TPU_FACTS).mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o311 if unlisted else 0o755)
    return CompileCache(folder.resolve(), True)


def release(cache: CompileCache | None) -> None:
    """After grading: the cache folder may be listed (and removed) again by its owner."""
    if cache is not None:
        try:
            os.chmod(cache.folder, 0o755)
        except OSError:
            pass


def students_own(build: Path) -> Path:
    """The student loop's cache folder: `LABKIT_COMPILE_CACHE_DIR` where set (a folder kept between
    containers, or shared by the runs of one machine), else the build folder's `.jax-cache`."""
    return Path(os.environ.get(envnames.COMPILE_CACHE_DIR) or Path(build) / ".jax-cache")


def wanted() -> bool:
    """False when `LABKIT_COMPILE_CACHE=off` asks for every program to be compiled in its own run."""
    return os.environ.get(envnames.COMPILE_CACHE, "on") != "off"
