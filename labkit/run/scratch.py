"""The one place where the kit's own (trusted, unsandboxed) process touches a folder a sandbox may write.

A run has two folders. Its *kit folder* (`RunFolders.kit`) holds what the kit writes and reads:
the notebook to run, the calls to make, papermill's executed copy and the run's log. The sandbox
sees it read-only. Its *scratch folder* (`RunFolders.scratch`, inside the kit folder) is the only
place the student's code may write: the kernel's working folder, its sockets, the harness's results.

Anything in a scratch folder may be a symbolic link to a file elsewhere, a named pipe that blocks
whoever opens it, a device, a socket or a file of any size, put there by the code the sandbox ran.
So the trusted process never opens, lists, follows or writes a path inside it except here:

* `empty` removes everything in it (dangling links included, never following one) before a run,
  and `remove` removes the whole folder after it;
* `read` opens one name with `O_NOFOLLOW | O_NONBLOCK`, relative to the folder opened itself with
  `O_NOFOLLOW`, accepts only a regular file, and reads at most a given number of bytes;
* `usage` adds up the disk space of everything in it (files, folders, links: never through one),
  which the kit reads while the run goes on to stop a run that writes more than it may;
* `create` writes a new file with `O_CREAT | O_EXCL | O_NOFOLLOW`, so it never writes through a
  name that already exists (it is used before the run starts, in a folder just emptied).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

SCRATCH = "scratch"  # the name of a run's scratch folder inside its kit folder


class Refused(OSError):
    """A name in a scratch folder that is not a regular file the kit may read (a link, a pipe, too large...)."""


@dataclass(frozen=True)
class RunFolders:
    """A run's two folders: `kit` (the kit's files, read-only to the run) and `scratch` (the run's own)."""

    kit: Path

    @property
    def scratch(self) -> Path:
        return self.kit / SCRATCH


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder` itself, which must be a real folder (not a link to one)."""
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read(folder: Path, name: str, limit: int) -> bytes:
    """The bytes of the regular file `name` in `folder`; `Refused` if it is anything else or longer than `limit`.

    Raises FileNotFoundError when there is no such name."""
    if "/" in name or name in ("", ".", ".."):
        raise Refused(f"{name!r} is not a plain name")
    dir_fd = _open_folder(folder)
    try:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd
            )
        except OSError as e:
            if e.errno == 40:  # ELOOP: the name is a symbolic link
                raise Refused(f"{name} is a symbolic link") from None
            raise
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{name} is not a regular file")
        if st.st_size > limit:
            raise Refused(f"{name} is larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise Refused(f"{name} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def kind(folder: Path, name: str) -> str:
    """What `name` in `folder` is, never following it: "file", "link", "folder", "other" (a pipe...) or "missing"."""
    try:
        dir_fd = _open_folder(folder)
    except OSError:
        return "missing"
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "missing"
    finally:
        os.close(dir_fd)
    return (
        "file"
        if stat.S_ISREG(mode)
        else "link"
        if stat.S_ISLNK(mode)
        else "folder"
        if stat.S_ISDIR(mode)
        else "other"
    )


def is_file(folder: Path, name: str) -> bool:
    """Whether `name` in `folder` is a regular file (a link to one is not)."""
    return kind(folder, name) == "file"


def create(folder: Path, name: str, data: bytes, mode: int = 0o600) -> Path:
    """Write a new file `name` in `folder`; FileExistsError if any entry of that name is there already."""
    dir_fd = _open_folder(folder)
    try:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
        )
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(folder) / name


def usage(folder: Path, limit: int | None = None) -> int:
    """The bytes of disk everything in `folder` takes: allocated blocks (a sparse file counts what it holds), and
    NAME_COST for each name (an inode and room in its folder: a million empty files are not nothing).

    Nothing is opened but folders, each with `O_NOFOLLOW` relative to its parent; every other entry is only
    looked at (`lstat`). A file with several names counts once. A folder the run made unreadable is opened up
    (its files are the run's). The walk stops as soon as the sum passes `limit`, when one is given. Folders
    nested more than MAX_DEPTH deep are `Refused`: a walk that cannot end soon is no measure."""
    seen: set[tuple[int, int]] = set()
    total = 0
    try:
        top = _open_folder(folder)
    except OSError:
        return 0
    stack = [(top, iter(_names(top)))]  # depth first: at most MAX_DEPTH folders open at once
    try:
        while stack and (limit is None or total <= limit):
            dir_fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            total += NAME_COST
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                if len(stack) > MAX_DEPTH:
                    raise Refused(f"folders nested more than {MAX_DEPTH} deep")
                child = _open_child_folder(dir_fd, name)
                if child is not None:
                    stack.append((child, iter(_names(child))))
    finally:
        for dir_fd, _ in stack:
            os.close(dir_fd)
    return total


def _names(dir_fd: int) -> list[str]:
    try:
        with os.scandir(dir_fd) as entries:
            return [e.name for e in entries]
    except OSError:
        return []


MAX_DEPTH = 64  # a scratch folder's folders nested deeper than this are refused (see `usage`)
NAME_COST = (
    4096  # bytes each name counts for in `usage`, on top of its blocks: a flood of empty files is not free
)


def _open_child_folder(dir_fd: int, name: str) -> int | None:
    """A descriptor of the folder `name` in `dir_fd` (never through a link), opened up first if it refuses; or None."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        pass
    except OSError:
        return None
    try:  # a folder the run made unreadable: make it readable again through a handle on the folder itself
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None


def unlink(folder: Path, name: str) -> None:
    """Remove the entry `name` from `folder` (a link is removed, never followed); nothing if it is gone."""
    try:
        dir_fd = _open_folder(folder)
    except OSError:
        return
    try:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def remove(folder: Path) -> None:
    """Remove `folder` and everything in it; a link in its place is removed, not followed."""
    folder = Path(folder)
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        folder.unlink()
        return
    # shutil.rmtree walks with descriptors and never follows a link (rmtree.avoids_symlink_attacks);
    # a folder the run made unreadable or unwritable is opened up again (it is the run's, and the run is over)
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(folder, onerror=_open_up)


def _open_up(_function: object, path: str, _exc_info: object) -> None:
    """rmtree's error handler: open up the folder that refused, then remove what is still there."""
    for target in (os.path.dirname(path), path):
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(target).st_mode):
                os.chmod(target, 0o700)
    if not os.path.lexists(path):
        return
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def empty(folder: Path) -> Path:
    """Make `folder` an empty folder: whatever was there (files, links, dangling ones, pipes) is removed first."""
    remove(folder)
    Path(folder).mkdir(parents=True, mode=0o755)
    return Path(folder)
