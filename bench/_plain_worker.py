"""One process of the plain MultiWorkerMirroredStrategy anchor: TF_CONFIG by hand, data in memory."""

import json
import os
import sys

rank, tf_config, data_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["TF_CONFIG"] = tf_config
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import w1  # noqa: E402

os.environ.update(w1.WORKER_ENV)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = w1.ring_strategy()
data = np.load(data_path)
dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(w1.WORKER_BATCH, drop_remainder=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
result = w1.fit(dataset.with_options(options), strategy)
with open(out_path, "w") as f:
    json.dump(result, f)
