"""A run's long setup work (recording demos) reports its progress: the throttled reporter a learner
worker gets, the status line that shows it, and a BC run whose dataset is recorded on first use."""

from __future__ import annotations

import pickle
import random
import threading
import time
import uuid

import ray
from rlinf_nb.runtime.setup_progress import SetupReporter, setup_text
from rlinf_nb.widgets.controls import status_html


@ray.remote(num_cpus=0)
class _Controller:
    """Stands where a RunController stands: something with ``report_setup``."""

    def __init__(self):
        self.reports = []

    def report_setup(self, task, done, total):
        self.reports.append((task, done, total))

    def seen(self):
        return self.reports


def test_reporter_sends_at_most_one_report_per_interval_and_always_the_last(attached):
    controller = _Controller.remote()
    reporter = SetupReporter(controller, "recording dataset (scripted:5)", min_interval_s=60.0)
    for done in range(1, 6):
        reporter(done, 5)
    copy = pickle.loads(pickle.dumps(reporter))  # as a learner worker gets it: throttled afresh
    copy(3, 9)
    time.sleep(0.5)
    seen = ray.get(controller.seen.remote())
    assert seen == [
        ("recording dataset (scripted:5)", 1, 5),  # the first one
        ("recording dataset (scripted:5)", 5, 5),  # the last one, within the interval
        ("recording dataset (scripted:5)", 3, 9),
    ]
    ray.kill(controller)


def test_the_status_line_shows_setup_progress_only_while_there_is_some():
    status = {
        "state": "starting",
        "setup": {"task": "recording dataset (scripted:200)", "done": 37, "total": 200},
    }
    assert setup_text(status) == "recording dataset (scripted:200) 37/200"
    assert "recording dataset (scripted:200) 37/200" in status_html(status)
    assert setup_text({**status, "setup": None}) is None
    assert "recording" not in status_html({**status, "setup": None})


def test_a_bc_run_reports_recording_its_dataset_while_launch_shows_a_bar(attached, capsys):
    import rlinf_nb as rl

    name = f"setup-{uuid.uuid4().hex[:6]}"
    seed = random.randrange(10_000, 10**9)  # a dataset no earlier run recorded: this run records it
    launched = []  # rl.launch returns once setup is over: it runs in a thread while this one watches
    launcher = threading.Thread(target=lambda: launched.append(rl.launch(
        "bc_pushcube", name=name, seed=seed, algo__dataset="scripted:30", budget__total_env_steps=400,
    )))  # fmt: skip
    launcher.start()
    seen, deadline = [], time.time() + 300
    while launcher.is_alive() and time.time() < deadline:
        try:
            status = rl.get_run(name).status()
        except (KeyError, RuntimeError, ValueError):  # the controller is not up yet
            time.sleep(0.1)
            continue
        if status["setup"] is not None:
            seen.append(status["setup"])
        time.sleep(0.1)
    launcher.join(timeout=60)
    assert launched, "rl.launch did not return"
    assert seen, "no setup progress was reported while the dataset was recorded"
    assert {s["task"] for s in seen} == {"recording dataset (scripted:30)"}
    assert {s["total"] for s in seen} == {30}
    done = [s["done"] for s in seen]
    assert done == sorted(done) and 1 <= done[0] and done[-1] <= 30
    assert f"{name}: recording dataset (scripted:30)" in capsys.readouterr().err  # launch's progress bar
    run = launched[0]
    run.wait(timeout=300, progress=False)
    assert run.status()["setup"] is None
    assert run.events().query("kind == 'dataset'").iloc[0]["episodes"] == 30
