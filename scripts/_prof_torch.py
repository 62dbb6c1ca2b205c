import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
B,NH,T,hs=16,16,1024,64; C=NH*hs
qkv=torch.randn(B,T,3*C,device="cuda",dtype=torch.bfloat16,requires_grad=True)
dy=torch.randn(B,T,C,device="cuda",dtype=torch.bfloat16)
def step():
    q,k,v=[t.view(B,T,NH,hs).transpose(1,2) for t in qkv.split(C,dim=2)]
    y=F.scaled_dot_product_attention(q,k,v,is_causal=True).transpose(1,2).contiguous().view(B,T,C)
    return torch.autograd.grad(y,qkv,dy)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3): step()
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): step()
        torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=90))
