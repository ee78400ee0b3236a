"""The documentation's examples (docs/examples/), run as the pages show them, on fewer workers,
rows and epochs: the code a reader copies from the site is code that runs. One worker where the
example's point is not the split (each worker's start is seconds of TensorFlow's import)."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"


def example(name):
    """docs/examples/<name>.py as a module, pickled by value to the workers (they cannot import it)."""
    from ray import cloudpickle

    spec = importlib.util.spec_from_file_location(f"raytf_docs_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def test_the_custom_loop_trains_and_keeps_the_best_two_checkpoints(cluster, tmp_path, no_leaks):
    result = example("custom_loop").main(storage_path=str(tmp_path), min_workers=1, max_workers=1, epochs=3,
                                         num_rows=2048)
    losses = [h["loss"] for h in result.history]
    assert [h["epoch"] for h in result.history] == [0, 1, 2] and losses[-1] < losses[0], result.history
    kept = sorted(p.name for p in (tmp_path / "custom-loop" / "checkpoints").iterdir() if p.is_dir())
    assert len(kept) == 2 and result.checkpoint.epoch == 2, kept  # num_to_keep=2, the latest always kept
    after_training(result.checkpoint, tmp_path / "exported")


def after_training(checkpoint, directory):
    """after_training.py on the custom loop's last checkpoint: scored offline on rows it never
    trained on, exported as a SavedModel and a .keras file that predict what the checkpoint does,
    and served by Ray Serve on this node's address in TF Serving's REST format."""
    import urllib.request

    import numpy as np
    import tensorflow as tf
    from ray import serve

    from tests.ports import free_port

    after = example("after_training")
    held_out = example("custom_loop").rows({"id": np.arange(100_000, 101_024)})
    x, y = held_out["x"], held_out["y"]
    scores = after.evaluate(checkpoint, x, y)
    assert scores["accuracy"] > 0.85, scores  # the label is a sign of x0 + x1: learned, not guessed
    saved_model, keras_file = after.export(checkpoint, str(directory))
    logits = after.predict(saved_model, x)
    assert np.mean(np.argmax(logits, axis=1) == y) == pytest.approx(scores["accuracy"], abs=1e-6)
    np.testing.assert_allclose(tf.keras.models.load_model(keras_file).predict(x, verbose=0), logits, rtol=1e-5,
                               atol=1e-5)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})  # one proxy, not per node
    try:
        serve.run(after.deployment(saved_model), name="classifier", route_prefix="/classify")
        request = urllib.request.Request(f"http://127.0.0.1:{port}/classify", method="POST",
                                         data=json.dumps({"instances": x[:5].tolist()}).encode())
        with urllib.request.urlopen(request, timeout=60) as answer:
            served = json.load(answer)["predictions"]
    finally:
        serve.shutdown()
    np.testing.assert_allclose(served, logits[:5], rtol=1e-5, atol=1e-5)


def test_ray_train_code_with_its_imports_swapped_trains(cluster, tmp_path, no_leaks):
    # One worker: Ray Train's code on raytf across workers is test_ray_train_compat.py's.
    result = example("ray_train_swap").main(storage_path=str(tmp_path), num_workers=1, use_gpu=False, epochs=3,
                                            num_rows=2048)
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], losses
    assert result.checkpoint is not None and result.checkpoint.epoch == 2


def test_the_recipe_checkpoints_to_s3_through_a_storage_uri_and_shows_none_of_its_credentials(
        cluster, s3_uri, s3_filesystem, no_leaks, capfd, caplog):
    """The keys in the URI (pyarrow's only way to take them from it) open the bucket and appear in
    nothing raytf prints, logs, raises or returns: the progress lines, the result, its repr and
    checkpoint, a storage error, ``raytf runs`` on an empty prefix."""
    from raytf import ConfigError
    from raytf._internal.runs import print_runs
    from raytf._internal.storage import RunStorage

    key, secret = "AKIARAYTFTESTKEY", "RAYTFTESTSECRETVALUE"
    uri = s3_uri.replace("s3://", f"s3://{key}:{secret}@")
    result = example("recipe_gpus_s3").main(storage_path=uri, num_workers=1, gpus_per_worker=0,
                                            cpus_per_worker=1, epochs=2, num_rows=4096)
    # A URI that opens the run once its keys are put back, query kept.
    assert result.path == s3_uri.replace("s3://", "s3://***:***@").replace("/uri?", "/uri/tf-keras-gpus?")
    assert result.checkpoint.path.startswith("raytf-test/uri/tf-keras-gpus/checkpoints/")  # on its filesystem
    import pyarrow.fs as pafs

    names = [i.base_name for i in s3_filesystem.get_file_info(pafs.FileSelector("raytf-test/uri/tf-keras-gpus/checkpoints"))
             if i.type == pafs.FileType.Directory]
    assert len(names) == 2, names
    assert result.metrics["accuracy"] > 0.2  # 10 classes: well above chance after two epochs
    with pytest.raises(ConfigError) as missing:  # a bucket that does not exist
        RunStorage(uri.replace("s3://{key}:{secret}@raytf-test/".format(key=key, secret=secret),
                               f"s3://{key}:{secret}@raytf-no-such-bucket/"), "r")
    print_runs(uri.replace("/uri?", "/empty-prefix?"))
    shown = capfd.readouterr()
    assert "results in s3://***:***@raytf-test/uri/tf-keras-gpus?" in shown.out + shown.err  # the progress line
    assert "no raytf runs in s3://***:***@raytf-test/empty-prefix?" in shown.out
    for text in (shown.out, shown.err, caplog.text, repr(result), str(result.checkpoint), str(missing.value)):
        assert key not in text and secret not in text, text[-2000:]


def test_each_ray_tune_trial_is_a_raytf_run_under_its_trials_name(cluster, tmp_path, no_leaks):
    """Two trials, one after the other, each a raytf run in a directory named after its trial (of
    one worker: what is shown is the trial's run, not its split); the better learning rate wins."""
    import signal

    original = signal.getsignal(signal.SIGINT)
    try:
        best = example("tune_trials").main(storage_path=str(tmp_path), learning_rates=(0.5, 0.01), num_workers=1,
                                           epochs=3, num_rows=1024, max_concurrent_trials=1)
    finally:
        signal.signal(signal.SIGINT, original)  # Tune leaves its own SIGINT handler installed
    assert best.config["lr"] == 0.5 and best.metrics["loss"] < 0.5  # chance is log(2) = 0.69
    assert (tmp_path / "search").is_dir()
    runs = [p for p in tmp_path.iterdir() if p.name.startswith("trial")]
    assert len(runs) == 2, sorted(p.name for p in tmp_path.iterdir())  # one raytf run per trial
    for run in runs:
        history = json.loads((run / "history.json").read_text())
        assert [h["epoch"] for h in history] == [0, 1, 2] and all(math.isfinite(h["loss"]) for h in history)
