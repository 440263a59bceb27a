"""realbench: plan and run RLHF training with parameter reallocation (the ReaL system).

The pipeline: scenario -> feasible options per call -> cost of each option -> simulated plan
-> search -> plan file -> run / export / report. See README.md.
"""

from realbench.errors import ConfigError

__all__ = ["ConfigError"]
__version__ = "0.1.0"
