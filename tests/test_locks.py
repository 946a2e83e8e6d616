"""The locks of runs and sweeps (dwg.pipeline.locks): asking whether a run is running never takes its lock, so probing
a run's lock as often as `status` may never makes executing that run fail; a whole smoke sweep runs to the end with
its status asked 20 times a second all along."""

import subprocess
import sys
import threading
import time
from dwg.pipeline.locks import RunBusy, run_lock
from dwg.pipeline.status import status
from dwg.pipeline.sweep_checks import load_sweep
from dwg.pipeline.sweep import make_graph
from _sweep_helpers import states, sweep_cli

PROBE = "from dwg.pipeline.locks import lock_holder as probe"
PROBE_LOOP = """
import sys, time
print("ready", flush=True)
n = held = 0
t0 = time.time()
while time.time() - t0 < float(sys.argv[2]):
    held += probe(sys.argv[1]) is not None
    n += 1
print(n, held)
"""


def hammer(lock, seconds: float, probe_code: str = PROBE) -> dict:
    """Take and release the run lock `lock` in a loop for `seconds` while another process probes it in a tight loop
    (`probe_code` defines `probe(path)`): how often taking it failed, succeeded, was probed and was seen held."""
    code = probe_code + "\n" + PROBE_LOOP
    prober = subprocess.Popen(
        [sys.executable, "-c", code, str(lock), str(seconds + 1)], stdout=subprocess.PIPE, text=True
    )
    assert prober.stdout.readline().strip() == "ready"
    busy = taken = 0
    t0 = time.time()
    while time.time() - t0 < seconds:
        try:
            with run_lock(lock):
                taken += 1
                time.sleep(0.0002)  # held long enough for the prober to see it now and then
        except RunBusy:
            busy += 1
    probes, held = map(int, prober.communicate(timeout=60)[0].split())
    return dict(busy=busy, taken=taken, probes=probes, held=held)


def test_probing_a_run_lock_never_makes_the_run_busy(tmp_path):
    "3 s of taking a run's lock in a loop beside a process probing it in a tight loop: never `RunBusy`."
    counts = hammer(tmp_path / "locks" / "models-abc.lock", 3.0)
    assert counts["busy"] == 0, counts
    assert counts["taken"] > 300 and counts["probes"] > 1000 and counts["held"] > 0, counts  # both really ran


def test_status_asked_all_through_a_smoke_sweep(tmp_path):
    "The smoke profile (real notebooks, tiny model) with `status` asked 20 times a second in this process: all done."
    rd = tmp_path / "runs"
    graph = make_graph(load_sweep("smoke"), rd)
    stop, seen, errors = threading.Event(), [], []

    def ask():
        while not stop.is_set():
            try:
                seen.append({i["state"] for items in status(rd, graph).values() for i in items})
            except Exception as e:  # any error is a finding: reported below
                errors.append(repr(e))
            time.sleep(0.05)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        r = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--no-progress")
    finally:
        stop.set()
        asker.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "being executed by another process" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert {i["state"] for i in states(rd).values()} == {"done"}
    assert not errors, errors[:3]
    assert len(seen) > 20 and any("running" in s for s in seen), len(seen)
