"""The `unirl` console script: a small supervisor, so that every process a command starts dies with it.

    P  the process you started and may kill
    └─ R  the reaper: a child subreaper (prctl PR_SET_CHILD_SUBREAPER) in its own process group, sent SIGTERM by
       │  the kernel when P dies (PR_SET_PDEATHSIG)
       └─ W  the command itself (`flows.cli.app`), in P's process group, so the terminal's Ctrl-C reaches it
          └─ whatever W starts: Prefect's temporary API server, a local Ray (gcs_server, raylet, its agents and
             workers), `unirl serve`'s servers, ...

Everything W starts stays a descendant of R whatever it does (an orphan is re-parented to R, even one that called
setsid), so R can stop it all:
- W exits: R stops what W left running (SIGTERM, `GRACE_S` seconds, then SIGKILL) and exits with W's status; P
  exits with R's. Output and exit codes are W's: P and R print nothing.
- P is killed, SIGKILL included (its whole process group too: R is not in it): R stops the whole tree the same way.
- P gets SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2 from a process (`kill PID`): W gets it, and reacts as
  it would unsupervised (`unirl serve` stops its servers). Signals from the terminal (Ctrl-C, Ctrl-\\) reach W
  directly, so P does not pass those on a second time.

Linux only (prctl). Elsewhere, or with `UNIRL_SUPERVISE=0`, the command runs in the process you started, as before,
and a SIGKILL can leave its servers and Ray running. The cost is two forks of a bare interpreter before anything
heavy is imported: the command starts about 3 ms later, and a run takes under 10 ms longer in all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

GRACE_S = 3.0  # seconds between SIGTERM and SIGKILL when stopping what is left
FORWARDED = {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
WATCHED = FORWARDED | {signal.SIGCHLD}
PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 1, 15, 36, 37
SI_KERNEL = 0x80  # si_code of a signal the kernel sent: the terminal's Ctrl-C to its foreground process group


def main():
    """The console script: the command under a supervisor (Linux), or the command alone."""
    libc = _prctl_libc() if os.environ.get("UNIRL_SUPERVISE", "1") != "0" else None
    if libc is None:
        return _run_command()
    top, group = os.getpid(), os.getpgrp()
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)  # from here on, signals are read by sigwaitinfo
    reaper = os.fork()
    if reaper:
        _exit_as(_wait_passing_signals(reaper))
    _become_reaper(top, libc)
    command = os.fork()
    if command == 0:
        _join_group(0, group)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        return _run_command()
    _join_group(command, group)
    _exit_as(_supervise(command, top))


def _run_command():
    import atexit
    import gc

    # Registered first, so it runs last: the interpreter's final collections would walk the whole heap that Prefect,
    # pydantic and the models built (0.4 s at every exit); frozen objects are skipped (only the memory of cyclic
    # garbage is left to the operating system, as at any exit).
    atexit.register(gc.freeze)
    from flows import console
    from flows.cli import app

    console.is_console_script = True  # this process is the command: its logging is ours to route (flows/console.py)
    return app()


def _prctl_libc():
    """libc, when it has the prctl calls the supervisor needs (Linux >= 3.4); else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int()
        return libc if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 else None
    except (OSError, AttributeError):
        return None


def _become_reaper(top: int, libc) -> None:
    """R: adopt every orphan below it, learn of P's death, and leave P's process group (a `kill -9 -PGID` of it
    then leaves R to clean up)."""
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    libc.prctl(PR_SET_NAME, b"unirl-reaper", 0, 0, 0)  # its name in ps and top (its command line stays P's)
    os.setpgid(0, 0)
    if os.getppid() != top:  # P died before the parent-death signal was armed
        os._exit(1)


def _join_group(pid: int, group: int) -> None:
    """Move W (`pid` 0 in W itself, W's pid in R: both sides, as shells do, so that W is in the group before it
    runs anything) into P's process group."""
    with contextlib.suppress(OSError):  # W has already exec'd or exited, or P's group is gone with P
        os.setpgid(pid, group)


def _wait_passing_signals(child: int) -> int:
    """P: wait for R, passing on the signals processes send (the terminal's already reached W)."""
    while True:
        info = signal.sigwaitinfo(WATCHED)
        if info.si_signo == signal.SIGCHLD:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid:
                return status
        elif info.si_code != SI_KERNEL:
            _send(child, info.si_signo)


def _supervise(command: int, top: int) -> int:
    """R: pass P's signals on to W until W exits, then stop what it left; stop everything when P dies."""
    status = None
    while status is None:
        info = signal.sigwaitinfo(WATCHED)
        if info.si_signo == signal.SIGCHLD:
            status = _reap(command)
        elif os.getppid() != top:  # P is gone: this is the parent-death signal
            stop_descendants()
            os._exit(1)  # nobody waits for this status any more
        else:
            _send(command, info.si_signo)
    stop_descendants()
    return status


def _reap(command: int) -> int | None:
    """Collect every exited child (W, and orphans re-parented here); W's wait status when W was one of them."""
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == command:
            status = code


def stop_descendants(grace_s: float = GRACE_S) -> None:
    """SIGTERM every living descendant of this process, then SIGKILL whatever still lives after `grace_s` (and
    whatever was started meanwhile), until none is left."""
    me = os.getpid()
    living = _descendants(me)
    for pid in living:
        _send(pid, signal.SIGTERM)
        _send(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
    deadline = time.monotonic() + grace_s
    while living and time.monotonic() < deadline:
        _settle()
        living = _descendants(me)
    while living:
        for pid in living:
            _send(pid, signal.SIGKILL)
        _settle()
        living = _descendants(me)


def _settle() -> None:
    signal.sigtimedwait({signal.SIGCHLD}, 0.05)
    _reap(-1)


def _descendants(root: int) -> list[int]:
    """Pids of the living (not zombie) processes below `root`, from /proc."""
    children: dict[int, list[int]] = {}
    zombies = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]  # the name in parentheses may hold anything
        children.setdefault(int(ppid), []).append(int(name))
        if state == b"Z":
            zombies.add(int(name))
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return [pid for pid in found if pid not in zombies]


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _exit_as(status: int) -> None:
    """Exit as the child whose wait status this is: the same exit code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # W's core only
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default action is not to terminate
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
