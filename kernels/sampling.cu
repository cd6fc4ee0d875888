// sampling.cu: logits -> token ids on the GPU, so only ids (and requested logprobs) reach the host.
// Entry points: argmax_{f32,f16,bf16}.
//
// argmax: logits [rows, vocab]; out_ids [rows]; one block per row; ties go to the lowest index
// (as torch.argmax and the CPU sampler do).
template <typename T>
__device__ void argmax(const T* logits, int* out_ids, int vocab) {
    long row = blockIdx.x;
    const T* lr = logits + row * (long)vocab;
    float best = KILN_NEG_INF;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = Io<T>::load(lr, i);
        if (v > best || (v == best && i < best_i)) {
            best = v;
            best_i = i;
        }
    }
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (ov > best || (ov == best && oi < best_i)) {
            best = ov;
            best_i = oi;
        }
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int nw = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
        for (int w = 1; w < nw; ++w)
            if (sv[w] > sv[0] || (sv[w] == sv[0] && si[w] < si[0])) {
                sv[0] = sv[w];
                si[0] = si[w];
            }
        out_ids[row] = si[0] == 0x7fffffff ? 0 : si[0];
    }
}

#define ARGMAX(SUF, T)                                                                              \
    extern "C" __global__ void argmax_##SUF(const T* logits, int* out_ids, int vocab) {             \
        argmax<T>(logits, out_ids, vocab);                                                          \
    }
KILN_FOR_FLOAT_TYPES(ARGMAX)
