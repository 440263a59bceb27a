"""RLHF dataflows: model function calls (MFCs) and the graph between them.

A call runs one model in one of three ways: `generate` (prefill + token-by-token decoding),
`inference` (one forward pass) or `train` (forward, backward, optimizer step). Calls exchange
data by key: a key produced by one call and consumed by another is a *data edge*; a key nobody
produces comes from the dataset. Besides data, a model's weights create *parameter-version*
dependencies: the model's calls in iteration i+1 read the weights that its train call of
iteration i wrote (a lag-1 edge), and within an iteration the train call must wait for the
model's other calls, which read the version it is about to overwrite (a lag-0 edge).
"""

from realbench.dataflow.core import CallDef, CallKind, Dataflow, load_dataflow
from realbench.dataflow.algorithms import ALGORITHMS, build_algorithm

__all__ = ["CallDef", "CallKind", "Dataflow", "load_dataflow", "ALGORITHMS", "build_algorithm"]
