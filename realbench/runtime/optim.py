"""The optimizer of a trained model on one rank, in mixed precision.

The stage computes in its buffer's dtype (bf16 or fp32). The optimizer keeps fp32 master weights
and Adam's two moments as flat tensors laid out like the stage's buffer (`shards.flat_offsets`),
so they can be saved, loaded and moved by the names of the shards. In fp32 the master weights are
the stage's own buffer; in bf16 they are an fp32 copy, and after each step the new weights are
rounded into the stage. Per parameter that is 2 bytes of bf16 weights, 2 of bf16 gradients, and
12 of fp32 master weights and moments: the 16 bytes the cost model assumes (the gradient is
widened to fp32 only for the update itself).

With LoRA (`spec.lora`) only the adapters train: they are the end of the stage's buffer
(`shards.trainable_start`), and the master weights, moments, weight decay, clipping and
checkpointed state cover that run alone; the frozen base has no gradients and no optimizer state.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam

from realbench.models.shards import flat_views, trainable_start


def decays(name: str) -> bool:
    """Whether weight decay applies to a parameter besides the embedding: not to norms and
    biases, as transformers' Trainer."""
    return not (name.endswith(".bias") or name.endswith("norm.weight"))


class MixedPrecisionAdam:
    """AdamW on the stage's shards (`settings`: a `realbench.plan.training.OptimizerSettings`;
    None: Adam at `lr`, no decay, no schedule, no clipping), its learning rate scheduled over
    `total_updates` optimizer updates."""

    def __init__(self, model, lr: float = 1e-3, settings=None, total_updates: int = 1):
        self.model, self.settings, self.total_updates = model, settings, total_updates
        st = model.stage
        self.start = trainable_start(st.spec, st.tp, st.pp, st.stage, st.v, st.ep, st.ep_rank)  # 0 unless LoRA
        flat = st.flat[self.start:]
        # fp32: one storage with the stage (updated in place); bf16: a copy that the stage follows
        self.master = torch.nn.Parameter(flat if flat.dtype == torch.float32 else flat.float())
        # the fused kernel (one pass over the flat tensor) where torch has it for the device
        self.fused = True if flat.device.type in ("cpu", "cuda") else None
        self.grad = torch.zeros_like(self.master)  # the stage's gradients, laid out as the master
        self.lr = lr if settings is None else settings.learning_rate
        self.betas = (0.9, 0.999) if settings is None else (settings.adam_beta1, settings.adam_beta2)
        self.eps = 1e-8 if settings is None else settings.adam_epsilon
        # Adam's state as torch.optim.Adam keeps it ({"step", "exp_avg", "exp_avg_sq"}; empty
        # before the first update), updated by torch's functional Adam: the same kernels, without
        # the Optimizer class, whose first call imports torch._dynamo (2-3 s per process)
        self.state: dict[str, torch.Tensor] = {}
        self.decay = None
        if settings is not None and settings.weight_decay:  # decoupled (AdamW): w <- w (1 - lr wd) before Adam
            self.decay = torch.zeros_like(self.master, dtype=torch.bool)
            tied_head = model.spec.tie_embeddings
            for name, view in self._views(self.decay).items():
                embedding = name == "embed.weight" or (name == "head.weight" and tied_head)
                view.fill_(settings.weight_decay_embeddings if embedding else decays(name))

    def learning_rate(self) -> float:
        """The learning rate of the next update."""
        if self.settings is None:
            return self.lr
        return self.settings.learning_rate_at(self.steps_taken, self.total_updates)

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        st = self.model.stage
        return flat_views(flat, st.spec, st.tp, st.pp, st.stage, st.v, st.ep, st.ep_rank, start=self.start)

    def zero_grad(self) -> None:
        for p in self.model.stage.parameters():
            p.grad = None

    @torch.no_grad()
    def nonfinite_gradient(self) -> str | None:
        """What is wrong with the first gradient holding a NaN or an infinity ("<name> holds nan"),
        or None when every gradient is finite."""
        for name, p in self.model.stage.named_parameters():
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return f"{name} holds {float(p.grad[~torch.isfinite(p.grad)][0])}"
        return None

    @torch.no_grad()
    def step(self, grad_scale: float = 1.0) -> None:
        """One AdamW update of the master weights from the stage's gradients (averaged over data
        parallelism already, times `grad_scale`: gradient clipping), at the scheduled learning
        rate, then the stage's weights from the master's."""
        grad = self.grad
        views = self._views(grad)
        for name, p in self.model.stage.named_parameters():
            if name not in views:  # frozen (the base under LoRA)
                continue
            if p.grad is not None:
                views[name].copy_(p.grad)
            else:
                views[name].zero_()
        if grad_scale != 1.0:
            grad.mul_(grad_scale)
        lr = self.learning_rate()
        if self.decay is not None:
            self.master.data[self.decay] *= 1.0 - lr * self.settings.weight_decay
        state = self._adam_state()
        adam([self.master], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
             fused=self.fused, amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=lr, weight_decay=0.0,
             eps=self.eps, maximize=False)
        self._sync_stage()

    def _sync_stage(self) -> None:
        """The stage's weights from the master's (bf16; in fp32 they share storage)."""
        if self.model.stage.flat.dtype != torch.float32:
            self.model.stage.flat[self.start:].copy_(self.master)

    # -- moving and checkpoints ---------------------------------------------------------------------------
    def state_views(self) -> dict[str, dict[str, torch.Tensor]]:
        """{"master", "exp_avg", "exp_avg_sq": shard views of the flat fp32 tensors}: what a plan
        switch moves (the moments start as zeros, step 0, before the first step: the state a
        fresh Adam builds)."""
        state = self._adam_state()
        return {"master": self._views(self.master), "exp_avg": self._views(state["exp_avg"]),
                "exp_avg_sq": self._views(state["exp_avg_sq"])}

    def _adam_state(self) -> dict[str, torch.Tensor]:
        """Adam's state, made as a fresh torch.optim.Adam makes it (step 0, zero moments) when
        there is none yet."""
        if not self.state:
            self.state.update(step=self._step_tensor(0), exp_avg=torch.zeros_like(self.master),
                              exp_avg_sq=torch.zeros_like(self.master))
        return self.state

    def _step_tensor(self, steps: int) -> torch.Tensor:
        """Adam's step count as torch keeps it: on the parameters' device for the fused kernel
        (which refuses a count on the CPU beside CUDA tensors), on the CPU otherwise."""
        return torch.tensor(float(steps), dtype=torch.float32, device=self.master.device if self.fused else "cpu")

    @property
    def steps_taken(self) -> int:
        return int(self.state["step"]) if self.state else 0

    @torch.no_grad()
    def moved_in(self, steps_taken: int) -> None:
        """After a switch or a resume wrote the master weights and moments: Adam's step count,
        and the stage's weights from the master's."""
        self._adam_state()["step"] = self._step_tensor(steps_taken)  # the moments exist
        self._sync_stage()

    # -- checkpoints --------------------------------------------------------------------------------------
    def tensors(self) -> tuple[dict[str, torch.Tensor], int]:
        """{name, name/exp_avg, name/exp_avg_sq: fp32 tensors} of the stage's shards, and the step."""
        out = {k: v.detach() for k, v in self._views(self.master).items() if k not in self.model.stage.aliases}
        state = self.state
        if not state:
            return out, 0
        for moment in ("exp_avg", "exp_avg_sq"):
            for k, v in self._views(state[moment]).items():
                if k not in self.model.stage.aliases:
                    out[f"{k}/{moment}"] = v
        return out, int(state["step"])
