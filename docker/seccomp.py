"""Write docker/seccomp.json: the seccomp profile the kit's docker targets give the course container.

    python3 docker/seccomp.py [--check]      (--check: fail when the committed profile differs)

Docker's default profile refuses what bubblewrap needs to make the kit's sandbox inside the
container (new namespaces, mounts, pivot_root), so `make docker-grade` would grade without it.
This profile is built the same way (refuse every system call that is not named, so a call newer
than this list is refused too) and names every Linux call of x86-64 and arm64 but the ones below:

* DENIED: what Docker's default profile refuses to a container without extra capabilities and
  that neither the kit nor bubblewrap needs: kernel modules, kexec, reboot, clocks, swap, quotas,
  accounting, BPF, perf events, the kernel keyring, handles to files by number, NUMA placement,
  userfaultfd, io_uring, the new mount API (fsopen and its family), and legacy calls.
* What bubblewrap needs and Docker's default profile allows only with CAP_SYS_ADMIN is allowed:
  unshare, clone and clone3 with namespace flags, setns, mount, umount2, pivot_root. These give
  a process nothing over the container: the namespaces it makes are its own (user namespaces
  owned by the container's unprivileged user), and the container keeps no capabilities.

The list of calls is fixed here (Linux 6.1's tables, in this file), so the profile is the same
wherever it is generated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "seccomp.json"

# Every system call name of Linux 6.1 on x86-64 and on arm64 (asm/unistd_64.h, asm-generic/unistd.h).
CALLS = """
_llseek _newselect _sysctl accept accept4 access acct add_key adjtimex afs_syscall alarm arch_prctl
bind bpf brk cachestat capget capset chdir chmod chown chroot clock_adjtime clock_getres clock_gettime
clock_nanosleep clock_settime clone clone3 close close_range connect copy_file_range creat create_module
delete_module dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2
epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64
fallocate fanotify_init fanotify_mark fchdir fchmod fchmodat fchown fchownat fcntl fdatasync fgetxattr
finit_module flistxattr flock fork fremovexattr fsconfig fsetxattr fsmount fsopen fspick fstat fstatfs
fsync ftruncate futex futex_waitv futimesat get_kernel_syms get_mempolicy get_robust_list get_thread_area
getcpu getcwd getdents getdents64 getegid geteuid getgid getgroups getitimer getpeername getpgid getpgrp
getpid getpmsg getppid getpriority getrandom getresgid getresuid getrlimit getrusage getsid getsockname
getsockopt gettid gettimeofday getuid getxattr init_module inotify_add_watch inotify_init inotify_init1
inotify_rm_watch io_cancel io_destroy io_getevents io_pgetevents io_setup io_submit io_uring_enter
io_uring_register io_uring_setup ioctl ioperm iopl ioprio_get ioprio_set kcmp kexec_file_load kexec_load
keyctl kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lgetxattr link linkat
listen listxattr llistxattr lookup_dcookie lremovexattr lseek lsetxattr lstat madvise mbind membarrier
memfd_create memfd_secret migrate_pages mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap
modify_ldt mount mount_setattr move_mount move_pages mprotect mq_getsetattr mq_notify mq_open
mq_timedreceive mq_timedsend mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock munlockall
munmap name_to_handle_at nanosleep newfstatat nfsservctl open open_by_handle_at open_tree openat openat2
pause perf_event_open personality pidfd_getfd pidfd_open pidfd_send_signal pipe pipe2 pivot_root
pkey_alloc pkey_free pkey_mprotect poll ppoll prctl pread64 preadv preadv2 prlimit64
process_madvise process_mrelease process_vm_readv process_vm_writev pselect6 ptrace putpmsg pwrite64
pwritev pwritev2 query_module quotactl quotactl_fd read readahead readlink readlinkat readv reboot
recvfrom recvmmsg recvmsg remap_file_pages removexattr rename renameat renameat2 request_key
restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn
rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_get_priority_max sched_get_priority_min
sched_getaffinity sched_getattr sched_getparam sched_getscheduler sched_rr_get_interval
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp security select
semctl semget semop semtimedop sendfile sendmmsg sendmsg sendto set_mempolicy set_mempolicy_home_node
set_robust_list set_thread_area set_tid_address setdomainname setfsgid setfsuid setgid setgroups
sethostname setitimer setns setpgid setpriority setregid setresgid setresuid setreuid setrlimit setsid
setsockopt settimeofday setuid setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4
socket socketpair splice stat statfs statx swapoff swapon symlink symlinkat sync sync_file_range syncfs
sysfs sysinfo syslog tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime
timer_settime timerfd_create timerfd_gettime timerfd_settime times tkill truncate tuxcall umask umount2
uname unlink unlinkat unshare uselib userfaultfd ustat utime utimensat utimes vfork vhangup vmsplice
vserver wait4 waitid write writev
""".split()  # noqa: SIM905 - a table of names, read as words

DENIED = """
acct add_key afs_syscall bpf clock_adjtime clock_settime create_module delete_module fanotify_init
finit_module fsconfig fsmount fsopen fspick get_kernel_syms get_mempolicy getpmsg init_module
io_uring_enter io_uring_register io_uring_setup ioperm iopl kcmp kexec_file_load kexec_load keyctl
lookup_dcookie mbind migrate_pages mount_setattr move_mount move_pages name_to_handle_at nfsservctl
open_by_handle_at open_tree perf_event_open putpmsg query_module quotactl quotactl_fd reboot
request_key security set_mempolicy set_mempolicy_home_node settimeofday swapoff swapon _sysctl sysfs
syslog tuxcall uselib userfaultfd ustat vhangup vserver
""".split()  # noqa: SIM905 - a table of names, read as words

# What bubblewrap needs beyond Docker's default profile (allowed above, named here for the tests).
FOR_BUBBLEWRAP = ["clone", "clone3", "mount", "pivot_root", "setns", "umount2", "unshare"]


def profile() -> dict:
    assert not set(DENIED) - set(CALLS) and not set(FOR_BUBBLEWRAP) & set(DENIED)
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        ],
        "syscalls": [
            {"names": sorted(set(CALLS) - set(DENIED)), "action": "SCMP_ACT_ALLOW"},
            {"names": sorted(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docker/seccomp.json differs")
    args = parser.parse_args()
    text = json.dumps(profile(), indent=1) + "\n"
    if args.check:
        if not PROFILE.exists() or PROFILE.read_text() != text:
            print(f"{PROFILE} is out of date: run python3 docker/seccomp.py", file=sys.stderr)
            return 1
        return 0
    PROFILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
