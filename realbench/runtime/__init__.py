"""The runtime: runs a plan on local processes (one a device; gloo on the CPU, NCCL on GPUs).

`launch.run_plan` starts the workers through Accelerate; each `worker` walks the plan, running its
calls' pipeline stages and tensor-parallel shards (`engine`, `model`, `rollout`), moving weights
between the calls' layouts (`realloc`), and training with the RLHF losses (`losses`, `algorithms`,
`optim`). Nothing is imported here: reading a scenario or estimating a plan loads none of it."""
