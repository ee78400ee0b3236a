"""The driver's display and the workers' quiet output: no Ray."""

import io

from raytf._internal.worker.logs import keep
from raytf._internal.driver.progress import ProgressDisplay, Rate, status_line
from raytf._internal.protocol import Progress, Report


def test_the_live_line_shows_epoch_step_speed_metrics_and_time_left():
    line = status_line(1, Progress(epoch=2, epochs=10, step=50, steps=100, global_batch=256),
                       {"loss": 0.123456, "acc": 0.9}, steps_per_s=20.0, width=200)
    assert line == ("attempt 1 (1 restart) | epoch 3/10 | step 50/100 [#####.....] | 5,120 samples/s | "
                    "loss=0.1235 acc=0.9 | ETA 38s")  # (7 epochs x 100 + 50 steps) / 20 per s = 37.5 s
    assert status_line(0, Progress(epoch=9, epochs=10, step=0, steps=100), {}, None, 200) == (
        "attempt 0 | epoch 10/10 | step 0/100 [..........]")
    assert status_line(0, Progress(step=7), {}, 2.5, 200) == "attempt 0 | step 7 | 2.5 steps/s"
    assert len(status_line(0, Progress(epoch=0), {"m" * 300: 1.0}, None, 80)) <= 80


def test_the_rate_follows_the_recent_steps_and_restarts_with_a_resumed_run():
    rate = Rate(window_s=10)
    assert rate.per_second() is None
    for t, step in [(0, 0), (5, 50), (10, 100), (20, 300)]:
        rate.add(t, step)
    assert rate.per_second() == 20.0  # the last 10 s: (300 - 100) / 10
    rate.add(21, 40)  # back to a checkpoint
    assert rate.per_second() is None


def display(live):
    stream = io.StringIO()
    clock = iter(range(1000)).__next__
    return ProgressDisplay("run", 1, stream, clock=lambda: float(clock()), live=live), stream


def test_off_a_terminal_there_are_report_lines_and_no_live_line():
    shown, stream = display(live=False)
    shown.update(0, Progress(epoch=0, step=3, steps=10))
    shown.report(Report(rank=0, seq=0, metrics={"epoch": 0, "loss": 1.5}, time=0.0))
    shown.close()
    [line] = stream.getvalue().splitlines()
    assert line.startswith("[raytf run ") and line.endswith("s] attempt 0 report 0: epoch=0 loss=1.5")
    assert "\r" not in stream.getvalue()


def test_on_a_terminal_the_live_line_is_redrawn_in_place_and_cleared_at_the_end():
    shown, stream = display(live=True)
    shown.update(0, Progress(epoch=0, epochs=2, step=3, steps=10))
    shown.report(Report(rank=0, seq=0, metrics={"epoch": 0, "loss": 1.5}, time=0.0))
    shown.close()
    shown.message("finished")
    text = stream.getvalue()
    assert "\r\033[Kattempt 0 | epoch 1/2 | step 3/10 [###.......]" in text
    assert "\r\033[K[raytf run " in text and text.endswith("s] finished\n")  # no live line after close


def test_worker_output_keeps_the_users_lines_and_drops_tensorflows_chatter():
    absl_info = "I0000 00:00:1795360303.546834   25094 port.cc:153] oneDNN custom operations are on."
    absl_warning = "W1122 15:00:00.123456   7 grappler.cc:9] something"
    no_gpu = "E0000 00:00:1795360199.669525   19750 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR"
    real_error = "E1122 15:00:00.123456   7 collective.cc:9] peer unreachable"
    for line, cpu_error, gpu_info in [
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", False, False),
        (absl_info, False, True), (absl_warning, False, True), (no_gpu, False, True), (real_error, True, True),
        ("epoch 3 loss 0.2", True, True), ("Traceback (most recent call last):", True, True),
        ("✔️  Dataset dataset_03524_0 execution finished in 0.00 seconds", False, False),
    ]:
        assert keep(line, "error", use_gpu=False) is cpu_error, line
        assert keep(line, "info", use_gpu=True) is gpu_info, line
