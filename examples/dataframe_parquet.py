"""Train on a dask.dataframe read from Parquet, where its partitions sit, and predict lazily.

    python examples/dataframe_parquet.py [PARQUET_DIR]

Writes scikit-learn's digits as 4 Parquet files (64 pixel columns and "target") into
PARQUET_DIR (default ``digits-parquet``), then trains on a LocalCluster of 2 worker
processes: each partition becomes a shard on the worker that read it (or, where Dask dealt
them out in turn, moves once so that each worker holds consecutive partitions), and nothing
is gathered to this process.  The same files train from the shell with
``python -m dtrain --set data.dataset=parquet --set data.path='digits-parquet/*.parquet'
--set data.label=target --set model.layers=[64,64,10]``.
"""
import sys
import warnings

import dask.dataframe as dd
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning

import dtrain


def main(path: str = "digits-parquet") -> None:
    warnings.filterwarnings("ignore", category=ConvergenceWarning)   # 30 epochs are few
    dd.from_pandas(load_digits(as_frame=True).frame, npartitions=4).to_parquet(
        path, write_index=False)

    # security=True: TLS with credentials made for this cluster, as dtrain's own clusters
    # have (a plain one on 127.0.0.1 runs the code of any user of the machine)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      security=True) as cluster, Client(cluster) as client:
        df = dd.read_parquet(path)                        # 4 partitions, read by the workers
        train, test = df.random_split([0.8, 0.2], random_state=0)
        clf = dtrain.MLPClassifier(hidden_layer_sizes=(64,), max_iter=30, random_state=0,
                                   client=client)
        clf.fit(train, "target")        # each partition a shard where it sits; "target" is y
        labels = clf.predict(test)      # lazy: nothing is read or computed yet
        print(labels)
        print(labels.compute()[:10])    # now each worker predicts its own partitions
        print(f"test accuracy {clf.score(test, 'target'):.4f}, computed on the cluster")
        s = clf.summary_                # data_moved: partitions moved once, into blocks
        print(f"{s['shards']} shards on {s['workers']} workers, strategy {s['strategy']}")


if __name__ == "__main__":      # the LocalCluster's worker processes import this file
    main(*sys.argv[1:])
