"""Quick fla-kernel timing on a GPU: chunk gated delta rule forward, Table 19 shape (T 2048, 16 heads,
d_v 128), d_k 128 vs 64 vs 32, bf16. Prints one JSON line per point; the real benchmark is
`state-reduction bench mixer`."""
import json
import sys

import torch
import triton.testing
from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule

out = []
for B in (8, 32):
    for K in (128, 64, 32):
        T, H, V = 2048, 16, 128
        q = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda")).to(torch.bfloat16)
        beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16)
        fn = lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
        row = {"B": B, "T": T, "H": H, "d_k": K, "d_v": V, "ms": ms}
        out.append(row)
        print(json.dumps(row), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
