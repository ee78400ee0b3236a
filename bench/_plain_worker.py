"""One process of the plain MultiWorkerMirroredStrategy anchor: TF_CONFIG by hand, data in memory.

    python _plain_worker.py RANK TF_CONFIG DATA.npz|- OUT.json [WORKLOAD]

WORKLOAD is the bench module defining it (w1, the default, or w2): its WORKER_ENV,
WORKER_BATCH, mwms_strategy() and fit(dataset, strategy); with DATA "-", fit(None, strategy)
makes its own rows.
"""

import importlib
import json
import os
import sys

rank, tf_config, data_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["TF_CONFIG"] = tf_config
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
workload = importlib.import_module(sys.argv[5] if len(sys.argv) > 5 else "w1")

os.environ.update(workload.WORKER_ENV)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = workload.mwms_strategy()
if data_path == "-":  # the workload makes its own rows
    with open(out_path, "w") as f:
        json.dump(workload.fit(None, strategy), f)
    sys.exit(0)
data = np.load(data_path)
dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(workload.WORKER_BATCH, drop_remainder=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
result = workload.fit(dataset.with_options(options), strategy)
with open(out_path, "w") as f:
    json.dump(result, f)
