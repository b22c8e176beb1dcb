"""dtrain's estimator in a scikit-learn Pipeline, its parameters tuned by GridSearchCV.

    python examples/pipeline_gridsearch.py

``dtrain.MLPClassifier`` is a scikit-learn estimator: it clones, goes into pipelines and is
cross-validated like any other.  Each fit is a dtrain run; without a ``client`` they all
share one LocalCluster, started by the first fit and closed when the script ends.
"""
import warnings

from sklearn.datasets import load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import dtrain


def main() -> None:
    warnings.filterwarnings("ignore", category=ConvergenceWarning)   # 40 epochs are few
    X, y = load_iris(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, stratify=y,
                                                        random_state=0)
    # the scaler does the normalization here, so dtrain's own is turned off
    pipe = make_pipeline(StandardScaler(),
                         dtrain.MLPClassifier(max_iter=40, normalize="none", random_state=0))
    grid = GridSearchCV(pipe, {"mlpclassifier__hidden_layer_sizes": [(4,), (32,)],
                               "mlpclassifier__learning_rate_init": [0.01, 0.05]}, cv=3)
    grid.fit(X_train, y_train)          # 4 candidates x 3 folds, then a refit: 13 dtrain runs
    for params, score in zip(grid.cv_results_["params"], grid.cv_results_["mean_test_score"]):
        print(f"{score:.3f}  {params}")
    print("best:", grid.best_params_)
    print(f"test accuracy of the refitted best pipeline: {grid.score(X_test, y_test):.3f}")


if __name__ == "__main__":      # the LocalCluster's worker processes import this file
    main()
