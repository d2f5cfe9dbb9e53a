"""bench.pyperf_worker's process handling: what forked managers and workers leave behind."""

import subprocess
import sys
import textwrap

#: A caller with multiprocessing's resource tracker already running (as a run is once a peer or
#: the shared buffer has used it) runs one manager through run_manager; its ``main`` is replaced
#: by one that makes a lock registered with the tracker (a spawn-context lock, as TorchRL's
#: buffers make in every worker) and says so on its stderr.
_CALLER = textwrap.dedent("""
    import multiprocessing as mp, sys
    from multiprocessing import resource_tracker
    from replaybench.bench import pyperf_worker

    resource_tracker.ensure_running()

    def main(argv, runner_cls=None):
        global lock
        lock = mp.get_context("spawn").Lock()
        print("made a lock", file=sys.stderr, flush=True)

    pyperf_worker.main = main
    argv = ["--target", "harness", "--op", "empty", "--batch", "1", "--mixed-adds", "1", "--seed", "0"]
    code = pyperf_worker.run_manager(argv, 60, sys.argv[1])
    assert code == 0 and not mp.active_children(), code
""")


def test_a_forked_manager_leaves_no_tracked_resource_behind(tmp_path):
    """Locks a forked manager (or worker) makes are unregistered when it exits: neither the
    caller's resource tracker (which reports what is left when the caller ends, on its stderr)
    nor one of the manager's own reports a leak."""
    stderr_file = tmp_path / "manager.err"
    proc = subprocess.run([sys.executable, "-c", _CALLER, str(stderr_file)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    manager = stderr_file.read_text()
    assert "made a lock" in manager  # the manager ran
    assert "leaked" not in proc.stderr and "leaked" not in manager, (proc.stderr, manager)
