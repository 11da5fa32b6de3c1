// Stage ablation of the SM90 kernel (bench/NOTES.md): build one binary per BSG_SM90_ABLATE value
// with bench/ablate.sh and run them on a Hopper GPU. Times one shape, median of 100 runs after 10
// warm-ups, CUDA events per run, inputs rotated over > 2x L2. Results are not checked (ablated
// variants compute garbage on purpose); the product path is verified by tests/gpu.rs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sm90_gemm.cuh"

#define CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(err_)); std::exit(1); } } while (0)

template <int BM, int BN, bool Swap>
float run(int m, int n, int k, int split) {
  const size_t a_bytes = size_t(m) * k / 2, b_bytes = size_t(n) * k / 2;
  const int64_t sp = bsg::sm90::sf_cols_padded(k);
  const size_t sfa = size_t(bsg::sm90::sf_batch_bytes(m, sp)), sfb = size_t(bsg::sm90::sf_batch_bytes(n, sp));
  const size_t set = a_bytes + b_bytes + sfa + sfb;
  const int sets = int(std::max<size_t>(2, 2 * 50 * (size_t(1) << 20) / set + 1));
  std::vector<uint8_t*> bufs(sets);
  std::vector<uint8_t> host(set);
  for (size_t i = 0; i < a_bytes + b_bytes; ++i) host[i] = uint8_t(i * 2654435761u >> 13);
  for (size_t i = a_bytes + b_bytes; i < set; ++i) host[i] = uint8_t(0x30 + (i * 7) % 16);  // scales 0.5 .. 1.875
  for (auto& p : bufs) { CHECK(cudaMalloc(&p, set)); CHECK(cudaMemcpy(p, host.data(), set, cudaMemcpyHostToDevice)); }
  void* d; CHECK(cudaMalloc(&d, size_t(m) * n * 2));
  bsg::KernelArgs args{m, n, k, 1, nullptr, nullptr, nullptr, nullptr, d, d, 1.f, 0.f, nullptr, 0, nullptr, 0, 132, split, nullptr, nullptr};
  using G = bsg::sm90::Gemm<BM, BN, Swap, __half>;
  size_t ws = G::workspace_size(args);
  void* w = nullptr;
  if (ws) { CHECK(cudaMalloc(&w, ws)); CHECK(cudaMemset(w, 0, ws)); }
  args.workspace = w; args.workspace_bytes = ws;
  auto launch = [&](int i) {
    uint8_t* base = bufs[i % sets];
    args.a = base; args.b = base + a_bytes; args.sfa = base + a_bytes + b_bytes; args.sfb = base + a_bytes + b_bytes + sfa;
    bsg::KernelStatus s = G::run(args);
    if (s.cutlass_status != 0 || s.cuda_error != 0) { std::printf("launch: %d %d\n", s.cutlass_status, s.cuda_error); std::exit(1); }
  };
  for (int i = 0; i < 10; ++i) launch(i);
  std::vector<cudaEvent_t> ev(200);
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  for (int i = 0; i < 100; ++i) { CHECK(cudaEventRecord(ev[2 * i])); launch(i); CHECK(cudaEventRecord(ev[2 * i + 1])); }
  CHECK(cudaDeviceSynchronize());
  std::vector<float> t(100);
  for (int i = 0; i < 100; ++i) CHECK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
  std::sort(t.begin(), t.end());
  // The same launches back to back between one pair of events: the GPU's time per GEMM when the
  // host queues ahead (the per-launch median above also holds the host's submission time
  // whenever it exceeds the kernel's).
  CHECK(cudaEventRecord(ev[0]));
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) launch(i);
  const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / 100;
  CHECK(cudaEventRecord(ev[1]));
  CHECK(cudaEventSynchronize(ev[1]));
  float total = 0.f;
  CHECK(cudaEventElapsedTime(&total, ev[0], ev[1]));
  std::printf("back-to-back: %.2f us per GEMM (host submits one in %.2f us); ", total * 10.f, host_us);
#if BSG_SM90_TIMELINE
  {
    const dim3 grid(unsigned(G::tiles(args)), unsigned(split));
    const size_t ctas = size_t(grid.x) * grid.y;
    uint64_t* tl;
    CHECK(cudaMalloc(&tl, ctas * 8 * 8));
    CHECK(cudaMemset(tl, 0, ctas * 8 * 8));
    CHECK(cudaMemcpyToSymbol(bsg::sm90::bsg_timeline, &tl, sizeof(tl)));
    launch(0);
    CHECK(cudaDeviceSynchronize());
    std::vector<uint64_t> h(ctas * 8);
    CHECK(cudaMemcpy(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost));
    uint64_t t0 = ~0ull, t_end = 0, last_start = 0;
    std::vector<double> pro, loop, epi, red[4];
    for (size_t c = 0; c < ctas; ++c) {
      const uint64_t* r = &h[c * 8];
      t0 = std::min(t0, r[0]);
      t_end = std::max(t_end, r[3]);
      last_start = std::max(last_start, r[0]);
      pro.push_back((r[1] - r[0]) / 1e3);
      loop.push_back((r[2] - r[1]) / 1e3);
      epi.push_back((r[3] - r[2]) / 1e3);
      if (r[5] && r[6] && r[7]) {
        red[0].push_back((r[5] - r[2]) / 1e3);
        red[1].push_back((r[6] - r[5]) / 1e3);
        red[2].push_back((r[7] - r[6]) / 1e3);
        red[3].push_back((r[3] - r[7]) / 1e3);
      }
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    auto mx = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    std::printf("\n  timeline (%zu CTAs): first CTA start to last CTA end %.2f us; last CTA starts at %.2f us;"
                " per CTA median/max: first stage %.2f/%.2f, loop %.2f/%.2f, after loop %.2f/%.2f us\n  ",
                ctas, (t_end - t0) / 1e3, (last_start - t0) / 1e3, med(pro), mx(pro), med(loop), mx(loop), med(epi), mx(epi));
    if (!red[0].empty())
      std::printf("after loop, medians: partial tile to shared %.2f, cluster barrier %.2f, sum and store %.2f, last barrier %.2f us\n  ",
                  med(red[0]), med(red[1]), med(red[2]), med(red[3]));
    uint64_t* none = nullptr;  // later launches (the hash below) must not write into freed memory
    CHECK(cudaMemcpyToSymbol(bsg::sm90::bsg_timeline, &none, sizeof(none)));
    cudaFree(tl);
  }
#endif
#if BSG_SM90_TRACE
  {
    uint64_t* tr;
    constexpr int kN = 2 * 64 * 6;
    CHECK(cudaMalloc(&tr, kN * 8));
    CHECK(cudaMemset(tr, 0, kN * 8));
    CHECK(cudaMemcpyToSymbol(bsg::sm90::bsg_trace, &tr, sizeof(tr)));
    launch(0);
    CHECK(cudaDeviceSynchronize());
    uint64_t h[kN];
    CHECK(cudaMemcpy(h, tr, sizeof(h), cudaMemcpyDeviceToHost));
    const int n = std::min(64, (k / 64) / split);
    for (int w = 0; w < 2; ++w) {
      double sum[6] = {0, 0, 0, 0, 0, 0};
      int cnt = 0;
      for (int i = 2; i + 1 < n; ++i, ++cnt) {
        const uint64_t* r = h + w * 64 * 6 + i * 6;
        if (r[0] == 0 || r[6] == 0) break;  // past the last traced iteration (a turn of k-tiles each)
        for (int q = 0; q < 5; ++q) sum[q] += double(r[q + 1] - r[q]);
        sum[5] += double(r[6] - r[0]);
      }
      if (cnt)
        std::printf("\n  trace CTA 0, thread %d, mean clocks per iteration (turn) over %d: issue %.0f, decode %.0f, wgmma wait %.0f, barrier %.0f, refill %.0f, iteration %.0f",
                    w * 128, cnt, sum[0] / cnt, sum[1] / cnt, sum[2] / cnt, sum[3] / cnt, sum[4] / cnt, sum[5] / cnt);
    }
    std::printf("\n  ");
    uint64_t* none = nullptr;  // later launches (the hash below) must not write into freed memory
    CHECK(cudaMemcpyToSymbol(bsg::sm90::bsg_trace, &none, sizeof(none)));
    cudaFree(tr);
  }
#endif
  // FNV-1a of D from input set 0 (D poisoned with 0xFF first): variants that must agree bit for
  // bit (a kernel change, not an ablation) print the same hash.
  {
    CHECK(cudaMemset(d, 0xFF, size_t(m) * n * 2));
    launch(0);
    std::vector<uint8_t> h(size_t(m) * n * 2);
    CHECK(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
    uint64_t x = 1469598103934665603ull;
    for (uint8_t b : h) x = (x ^ b) * 1099511628211ull;
    std::printf("D hash %016llx; ", static_cast<unsigned long long>(x));
  }
  for (auto p : bufs) cudaFree(p);
  cudaFree(d); if (w) cudaFree(w);
  return t[50] * 1000.f;
}

// How many clusters of 2..kMaxClusterSplit CTAs of the 128x256 cluster kernel fit on the GPU at
// once (cudaOccupancyMaxActiveClusters): the split-K clusters of a launch beyond that wait for a
// second wave.
int clusters() {
  auto kernel = bsg::sm90::gemm_kernel<128, 256, true, __half, true>;
  using T = bsg::sm90::Tile<128, 256, true>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%d SMs; 128x256 tile, at most active at once:", sms);
  for (int s = 2; s <= bsg::sm90::kMaxClusterSplit; ++s) {
    const bsg::sm90::KernelLaunch launch(dim3(unsigned(sms), unsigned(s)), T::kLaunchThreads, s, T::kSmem, nullptr);
    int n = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &launch.cfg));
    std::printf(" %d clusters of %d (%d CTAs);", n, s, n * s);
  }
  std::printf("\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "clusters") return clusters();
  if (argc != 6 && argc != 7) {
    std::printf("usage: ablate M N K BN(64|128|s128|256) SPLIT [BM(128|256, 256 with BN 128)] | ablate clusters\n"
                "  (s128: the swapped 128x128 tile)\n");
    return 2;
  }
  int m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]), split = std::atoi(argv[5]);
  const bool swapped128 = std::string(argv[4]) == "s128";
  const int bn = swapped128 ? 128 : std::atoi(argv[4]);
  const int bm = argc == 7 ? std::atoi(argv[6]) : 128;
  float us = bm == 256 ? run<256, 128, true>(m, n, k, split)
             : bn == 256 ? run<128, 256, true>(m, n, k, split)
             : bn == 64  ? run<128, 64, false>(m, n, k, split)
             : swapped128 ? run<128, 128, true>(m, n, k, split) : run<128, 128, false>(m, n, k, split);
  std::printf("ablate=%d (%s%s%s) %dx%dx%d BM=%d BN=%s%d split=%d: %.2f us\n", BSG_SM90_ABLATE,
              BSG_SM90_ABLATE & 1 ? "no-decode " : "", BSG_SM90_ABLATE & 2 ? "no-mma " : "", BSG_SM90_ABLATE & 4 ? "no-loads" : "",
              m, n, k, bm, swapped128 ? "s" : "", bm == 256 ? 128 : bn, split, us);
  return 0;
}
