"""The reward of an AReaL job, as realbench's scenario names it.

AReaL scores each response inside its rollout workflow (the `reward_fn` its train script hands to
RLVRWorkflow, areal/workflow/rlvr.py:95-108), a Python function run on the rollout workers' CPUs
while generation goes on; its experiment YAML does not name it. A scenario read from AReaL
(`realbench import areal`) names this function in its place: realbench prices its CPU time per
response on the rollout's GPUs' hosts (models.FunctionSpec.seconds_per_sample) and never calls it.
"""


def workflow_reward(prompts, completions, **columns):
    raise RuntimeError("AReaL computes this reward in its rollout workflow (its train script's reward_fn); "
                       "realbench plans an AReaL job and does not run it: export it (--format areal)")
