"""pruned-synth: real and verifier-pruned synthetic rows of a Gaussian mixture.

El Firdoussi et al. (ICLR 2025), "Maximizing the potential of synthetic data:
insights from random matrix theory". One run holds one or more experiments
(a grid over config values); every row names its experiment.
"""
import pyarrow as pa

from schemas.table import Field, TableSchema

DATASET = "pruned-synth"

ROWS = TableSchema(
    dataset=DATASET,
    table="rows",
    version=1,
    doc="Real, synthetic and test rows: features, true and observed labels, keep decision.",
    split_field="source",
    fields=(
        Field("id", pa.string(), "Stable hash of experiment, source and index."),
        Field("experiment", pa.string(), "Id of the experiment (row of the experiments table)."),
        Field("source", pa.string(),
              "real: n training rows x = y*mu + z; synthetic: m rows drawn from the "
              "estimated generator; test: held-out real rows for accuracy."),
        Field("index", pa.int64(), "Position of the row in its source stream (0-based)."),
        Field("x", pa.list_(pa.float32()), "Feature vector of length p."),
        Field("y_true", pa.int8(), "True class, +1 or -1."),
        Field("y_observed", pa.int8(),
              "Label the classifier sees: y_true, flipped with probability epsilon "
              "for synthetic rows."),
        Field("kept", pa.bool_(),
              "Verifier decision: always true for real rows; for synthetic rows kept with "
              "probability phi if correct, rho if flipped (or the learned verifier's "
              "decision); null for test rows, which never enter training.", nullable=True),
    ),
)

EXPERIMENTS = TableSchema(
    dataset=DATASET,
    table="experiments",
    version=1,
    doc="One row per experiment: its parameters and the generator it used.",
    fields=(
        Field("id", pa.string(), "Stable hash of the experiment's resolved parameters."),
        Field("params_json", pa.string(), "The experiment's resolved config as JSON."),
        Field("swept", pa.string(), "JSON list of the config keys varied by the grid."),
        Field("p", pa.int64(), "Dimension of x."),
        Field("n", pa.int64(), "Number of real training rows."),
        Field("n_hat", pa.int64(),
              "Real rows the generator is estimated from (0: exact generator). Gaussian mode draws "
              "them independently of the n training rows and does not write them (mu_hat and "
              "cov_hat keep the fit); with a features file they are the first n_hat real rows."),
        Field("m", pa.int64(), "Number of synthetic rows drawn before pruning."),
        Field("n_test", pa.int64(), "Number of test rows."),
        Field("epsilon", pa.float64(), "Label flip probability of synthetic rows."),
        Field("phi", pa.float64(), "Probability the verifier keeps a correctly labelled synthetic row."),
        Field("rho", pa.float64(), "Probability the verifier keeps a flipped synthetic row."),
        Field("gamma", pa.float64(), "Ridge regularisation of the classifier (and learned verifier)."),
        Field("mu_norm", pa.float64(), "||mu|| of the Gaussian mixture (null with a features file).",
              nullable=True),
        Field("seed", pa.int64(), "Seed of every random stream of the experiment."),
        Field("verifier", pa.string(), "rates: keep with probabilities (phi, rho); learned: a ridge "
              "classifier trained on the real rows keeps rows whose label it agrees with."),
        Field("mu", pa.list_(pa.float64()),
              "True class mean mu (null when real rows come from a features file).", nullable=True),
        Field("mu_hat", pa.list_(pa.float64()), "Generator mean: mu, or the estimate from n_hat rows."),
        Field("cov_hat", pa.list_(pa.float64()),
              "Generator covariance, p*p row-major; null for the exact generator (identity).",
              nullable=True),
    ),
)

TABLES = (ROWS, EXPERIMENTS)
