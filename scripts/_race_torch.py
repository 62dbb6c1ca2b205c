import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q,k,v=[torch.randn(2,4,256,64,device="cuda",dtype=torch.bfloat16,requires_grad=True) for _ in range(3)]
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    y=F.scaled_dot_product_attention(q,k,v,is_causal=True); y.sum().backward()
torch.cuda.synchronize(); print("torch cudnn sdpa done")
