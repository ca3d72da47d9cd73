#!/usr/bin/env python3
"""PyTorch peer of `fusebox bench train --preset gpt2-124m`: seconds per full training
step (forward, backward, gradient clipping, AdamW) of a GPT-2 124M-shaped model on
random tokens, median of the measured steps after warm-up, PyTorch eager on the CPU.

The step is the one fusebox's Trainer takes: vocab 50257, 12 layers, 12 heads, width
768, MLP 3072, 1024 learned positions, pre-LayerNorm blocks with biases, tanh GELU,
causal attention (F.scaled_dot_product_attention), output head tied to the token
embedding, mean cross-entropy on random next tokens, global-norm clipping at 1.0,
AdamW (lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the weight matrices
only, PyTorch's default foreach implementation), all in f32 — or, with `--autocast bf16`,
the forward and loss under `torch.autocast("cpu", dtype=torch.bfloat16)` (PyTorch's
mixed precision: BF16 matmuls through oneDNN, f32 master weights and optimizer state).

`--ddp N` runs N processes (gloo on loopback, `--threads` threads each), each its own
micro-batch of `--batch` × `--seq` tokens, the model wrapped in DistributedDataParallel
(gradients averaged, bucketed and overlapped with the backward as DDP does); rank 0
reports the step time and tokens/s of all ranks together.

Usage (from the repository root; the ratio needs both on the same machine, same
thread count, ideally run in alternation):
    python3 bench/peers/torch_gpt2.py [--batch 4] [--seq 64] [--steps 5] [--threads 2]
        [--autocast bf16] [--ddp N] [--json]
    cargo run --release -p fusebox-cli -- bench train --preset gpt2-124m --batch 4 --seq 64 --threads 2

On a machine shared with other work, set OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP
threads otherwise spin at every barrier, and with more runnable threads than cores
that spinning alone made the step about 3x slower (14-22 s instead of 5.5 s here).
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, LAYERS, HEADS, WIDTH, MLP, POSITIONS = 50257, 12, 12, 768, 3072, 1024


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.o = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH, eps=1e-5)
        self.fc = nn.Linear(WIDTH, MLP)
        self.proj = nn.Linear(MLP, WIDTH)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, HEADS, d // HEADS).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(POSITIONS, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm_f = nn.LayerNorm(WIDTH, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("o.weight", "proj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.norm_f(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def run(rank, args):
    """One process's measurement; prints the result from rank 0."""
    world = max(args.ddp, 1)
    torch.set_num_threads(args.threads)
    if args.ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = Gpt2()
    net = model
    if args.ddp:
        net = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("wte", "wpe"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(("wte", "wpe")))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    generator = torch.Generator().manual_seed(100 + rank)

    def step():
        ids = torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=generator)
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(ids[:, :-1], ids[:, 1:])
        else:
            loss = net(ids[:, :-1], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(2):
        step()
    times = []
    for _ in range(max(args.steps, 1)):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if args.ddp:
        # Every rank's median, the slowest reported: a step ends when all ranks have.
        t = torch.tensor([statistics.median(times)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        s = t.item()
        dist.destroy_process_group()
    else:
        s = statistics.median(times)
    if rank != 0:
        return
    params = sum(p.numel() for p in model.parameters())
    tokens_per_s = world * args.batch * args.seq / s
    precision = f"autocast-{args.autocast}" if args.autocast else "fp32"
    if args.json:
        print(json.dumps({"name": "torch_gpt2_train_step", "seconds_per_step": s, "ms": s * 1e3,
                          "tokens_per_s": tokens_per_s, "batch": args.batch, "seq": args.seq,
                          "threads": args.threads, "ranks": world, "precision": precision,
                          "params": params, "torch": torch.__version__}))
    else:
        ranks = f", {world} DDP ranks" if args.ddp else ""
        print(f"torch {torch.__version__} train step gpt2-124m ({params / 1e6:.1f}M params, {precision}{ranks}), batch "
              f"{args.batch} x seq {args.seq}, {args.threads} threads: seconds_per_step {s:.3f} (median of "
              f"{len(times)}), {tokens_per_s:.0f} tokens/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5, help="measured steps (after 2 warm-up steps)")
    ap.add_argument("--threads", type=int, default=2, help="threads per process")
    ap.add_argument("--autocast", choices=["bf16"], help="mixed precision: forward and loss under torch.autocast")
    ap.add_argument("--ddp", type=int, default=0, help="processes of DistributedDataParallel (gloo); 0: none")
    ap.add_argument("--port", type=int, default=29517, help="loopback port of the --ddp rendezvous")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.ddp < 0:
        ap.error(f"--ddp takes a number of processes, got {args.ddp}")
    if args.ddp:
        import torch.multiprocessing as mp

        mp.spawn(run, args=(args,), nprocs=args.ddp, join=True)
    else:
        run(0, args)


if __name__ == "__main__":
    main()
