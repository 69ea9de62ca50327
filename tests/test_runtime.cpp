// SPDX-License-Identifier: Apache-2.0
// Runtime tests: creation errors, hot reload, a broken file during reload,
// readers racing a reload, and the epoch-based reclamation of old snapshots.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "table/epoch.hpp"
#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;
using table::EpochDomain;

namespace {

const char* kName = "E=8,N=64,device_name=NVIDIA_H200.json";
const std::string kTable =
    R"({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}})";
const std::string kRow = row({{"BLOCK_SIZE_M", 16},
                              {"BLOCK_SIZE_N", 32},
                              {"BLOCK_SIZE_K", 64},
                              {"GROUP_SIZE_M", 1},
                              {"num_warps", 4},
                              {"num_stages", 2}});

struct Tracked {
  std::atomic<int>* freed;
};
void free_tracked(void* p) {
  auto* t = static_cast<Tracked*>(p);
  t->freed->fetch_add(1);
  delete t;
}

// Holds an epoch guard on its own thread until released.
class Reader {
 public:
  explicit Reader(EpochDomain& d) {
    std::promise<void> entered;
    auto entered_f = entered.get_future();
    thread_ = std::thread([&d, this, p = std::move(entered)]() mutable {
      {
        EpochDomain::Guard g(d);
        p.set_value();
        release_.get_future().wait();
      }
      left_.set_value();
      done_.get_future().wait();  // keep the thread (and its slot) alive until joined
    });
    entered_f.wait();
  }
  // Leaves the critical section; returns once the guard is gone.
  void leave() {
    if (!released_) release_.set_value();
    released_ = true;
    left_f_.wait();
  }
  ~Reader() {
    if (!released_) release_.set_value();  // a failed check must not hang the join
    done_.set_value();
    thread_.join();
  }

 private:
  bool released_ = false;
  std::promise<void> release_, left_, done_;
  std::future<void> left_f_ = left_.get_future();
  std::thread thread_;
};

}  // namespace

TEST_CASE("runtime: create refuses a missing dir, naming it") {
  TempDir dir;
  const std::string missing = (dir / "no-such-dir").string();
  auto r = Runtime::create(options_for({dir.str(), missing}));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::invalid_argument);
  CHECK(r.status().message() == "config dir '" + missing + "' does not exist");

  write_text(dir / "file.json", "{}");
  auto f = Runtime::create(options_for({(dir / "file.json").string()}));
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == StatusCode::invalid_argument);
  CHECK(f.status().message() == "config dir '" + (dir / "file.json").string() + "' is not a directory");

  RuntimeOptions o = options_for({dir.str()});
  o.bounded_nearest = true;
  o.bound_ratio = 0.5;
  auto b = Runtime::create(o);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == StatusCode::invalid_argument);
  CHECK(contains(b.status().message(), "bound_ratio"));

  // An empty dir is fine: an empty table.
  TempDir empty;
  auto rt = make_runtime({empty.str()});
  CHECK(rt->load_report().files.empty());
  CHECK(rt->load_report().keys == 0);
}

TEST_CASE("runtime: reload() picks up a new file, a broken one changes only the report") {
  TempDir dir;
  auto rt = make_runtime({dir.str()});
  CHECK(lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1)).match == LookupResult::Match::fallback);

  write_text(dir / kName, kTable);
  // The published table is immutable: nothing changes until reload().
  CHECK(lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1)).match == LookupResult::Match::fallback);
  REQUIRE(rt->reload().ok());
  auto hit = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1));
  CHECK(hit.match == LookupResult::Match::exact);
  CHECK(config_to_json(hit.config) == kRow);
  CHECK(hit.source == kName);
  {
    const LoadReport rep = rt->load_report();
    REQUIRE(rep.files.size() == 1);
    CHECK(rep.files[0].state == FileReport::State::loaded);
    CHECK(rep.keys == 1);
    CHECK(rep.rows == 1);
  }

  // A torn file dropped in next to it: reported, skipped; the old rows keep serving.
  const std::string torn_name = "E=8,N=128,device_name=NVIDIA_H200.json";
  write_text(dir / torn_name, kTable.substr(0, 40));
  REQUIRE(rt->reload().ok());
  {
    const LoadReport rep = rt->load_report();
    REQUIRE(rep.files.size() == 2);
    const FileReport* torn = find_file(rep, torn_name);
    REQUIRE(torn != nullptr);
    CHECK(torn->state == FileReport::State::skipped);
    CHECK(contains(torn->problems[0], "parse error at byte 40:"));
    CHECK(find_file(rep, kName)->state == FileReport::State::loaded);
    CHECK(rep.keys == 1);
    CHECK(rep.rows == 1);
  }
  auto again = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1));
  CHECK(again.match == LookupResult::Match::exact);
  CHECK(config_to_json(again.config) == kRow);
  CHECK(lookup_ok(*rt, query("E=8,N=128", "NVIDIA H200", 1)).match == LookupResult::Match::fallback);

  // The same source keeps its id across reloads.
  CHECK(rt->source_path(1) == kName);
}

TEST_CASE("runtime: readers racing reloads always see a whole table") {
  TempDir dir;
  write_text(dir / kName, kTable);
  auto rt = make_runtime({dir.str()});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> bad{0}, done{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&] {
      while (!stop.load()) {
        auto r = lookup(*rt, query("E=8,N=64", "NVIDIA H200", 1));
        if (!r.ok() || r->match != LookupResult::Match::exact || config_to_json(r->config) != kRow) ++bad;
        ++done;
      }
    });
  for (int i = 0; i < 20; ++i) REQUIRE(rt->reload().ok());
  while (done.load() < 200) std::this_thread::yield();
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("runtime: EpochDomain frees a retired object once the readers that could hold it leave") {
  EpochDomain& d = EpochDomain::global();
  d.reclaim();
  const size_t base = d.pending();
  static int owner_tag = 0;
  const void* owner = &owner_tag;

  SUBCASE("no reader: freed at once") {
    std::atomic<int> freed{0};
    d.retire(new Tracked{&freed}, &free_tracked, owner);
    CHECK(freed.load() == 1);
    CHECK(d.pending() == base);
  }
  SUBCASE("a reader that entered before the retire blocks it; one that entered after does not") {
    std::atomic<int> freed{0};
    Reader early(d);
    d.retire(new Tracked{&freed}, &free_tracked, owner);
    CHECK(freed.load() == 0);
    CHECK(d.pending() == base + 1);
    d.reclaim();
    CHECK(freed.load() == 0);
    Reader late(d);  // entered after the retire: cannot hold the object
    early.leave();
    d.reclaim();
    CHECK(freed.load() == 1);
    CHECK(d.pending() == base);
    late.leave();
  }
  SUBCASE("pending() counts every object still waiting") {
    std::atomic<int> freed{0};
    Reader r(d);
    for (int i = 0; i < 3; ++i) d.retire(new Tracked{&freed}, &free_tracked, owner);
    CHECK(d.pending() == base + 3);
    CHECK(freed.load() == 0);
    r.leave();
    d.reclaim();
    CHECK(freed.load() == 3);
    CHECK(d.pending() == base);
  }
  SUBCASE("nested guards on one thread count as one critical section") {
    std::atomic<int> freed{0};
    {
      EpochDomain::Guard outer(d);
      {
        EpochDomain::Guard inner(d);
        d.retire(new Tracked{&freed}, &free_tracked, owner);
      }
      d.reclaim();
      CHECK(freed.load() == 0);  // still inside `outer`
    }
    d.reclaim();
    CHECK(freed.load() == 1);
    CHECK(d.pending() == base);
  }
  SUBCASE("drop_owner frees an owner's objects regardless of readers") {
    std::atomic<int> freed{0}, other{0};
    static int other_tag = 0;
    Reader r(d);
    d.retire(new Tracked{&freed}, &free_tracked, owner);
    d.retire(new Tracked{&other}, &free_tracked, &other_tag);
    CHECK(d.pending() == base + 2);
    d.drop_owner(owner);
    CHECK(freed.load() == 1);
    CHECK(other.load() == 0);
    CHECK(d.pending() == base + 1);
    r.leave();
    d.reclaim();
    CHECK(other.load() == 1);
    CHECK(d.pending() == base);
  }
}

// validate_gemm tests every condition at once and builds a message only when
// that fails (check_gemm_detailed, the same checks one by one): each bad
// argument is named. (That the two paths agree on random arguments, for
// every op of the list: tests/test_validate.cpp.)
TEST_CASE("gemm arguments: each bad argument is named") {
  using dispatch::GemmArgs;
  using dispatch::make_tensor_1d;
  using dispatch::make_tensor_2d;
  std::vector<float> buf(4096, 1.f);
  float* a = buf.data();
  float* b = buf.data() + 1024;
  float* d = buf.data() + 2048;
  float* bias = buf.data() + 3072;
  auto ok_args = [&] {
    return GemmArgs{make_tensor_2d(a, DType::fp32, 4, 8, 8), make_tensor_2d(b, DType::fp32, 16, 8, 8),
                    make_tensor_2d(d, DType::fp32, 4, 16, 16), make_tensor_1d(bias, DType::fp32, 16)};
  };
  auto msg = [](const GemmArgs& g) {
    dispatch::core::Problem p;
    dispatch::core::LaunchArgs la;
    bool empty = false;
    const Status s = dispatch::api::validate_gemm(g, &p, &la, &empty);
    return s.ok() ? std::string("ok") : s.message();
  };
  CHECK(msg(ok_args()) == "ok");
  GemmArgs g = ok_args();
  g.a.rank = 3;
  CHECK(msg(g) == "a: must be rank 2, got rank 3");
  g = ok_args();
  g.b.data = nullptr;
  CHECK(msg(g) == "b: data is null");
  g = ok_args();
  g.a.strides[1] = 2;
  CHECK(msg(g) == "a: needs unit stride along its last dimension, got stride 2");
  g = ok_args();
  g.d.strides[0] = 0;
  CHECK(msg(g) == "d: an output cannot have row stride 0");
  g = ok_args();
  g.b.strides[0] = 4;
  CHECK(msg(g) == "b: row stride 4 is smaller than its row length 8 (rows overlap)");
  g = ok_args();
  g.b = make_tensor_2d(b, DType::fp32, 16, 7, 7);
  CHECK(msg(g) == "b: shape [16, 7] does not match a [4, 8]: b must be [N, K] with K = 8");
  g = ok_args();
  g.d = make_tensor_2d(d, DType::fp32, 4, 15, 16);
  CHECK(msg(g) == "d: shape [4, 15] must be [M, N] = [4, 16]");
  g = ok_args();
  g.a.dtype = DType::bf16;
  CHECK(msg(g) == "a is bf16 but b is fp32: mixed input dtypes are not supported");
  g = ok_args();
  g.bias = make_tensor_1d(bias, DType::fp32, 15);
  CHECK(msg(g) == "bias: must have 16 elements, has 15");
  g = ok_args();
  g.bias.dtype = DType::bf16;
  CHECK(msg(g) == "bias: dtype bf16 must equal d's dtype fp32");
  g = ok_args();
  g.d.device = Device{DeviceType::cuda, 1};
  CHECK(msg(g) == "d is on cuda:1 but a is on cpu:0");
  g = ok_args();
  g.d.data = a + 4;
  CHECK(msg(g) == "d: overlaps an input");
  g = ok_args();
  g.a.shape[1] = -1;
  CHECK(msg(g) == "a: negative shape [4, -1]");
  g = ok_args();
  g.b.strides[0] = -8;
  CHECK(msg(g) == "b: negative row stride");
  g = ok_args();
  g.a = make_tensor_2d(a, DType::fp32, 4, 0, 0);
  g.b = make_tensor_2d(b, DType::fp32, 16, 0, 0);
  CHECK(msg(g) == "b: N and K must be >= 1, got [16, 0]");
  g = ok_args();
  g.bias.rank = 2;
  CHECK(msg(g) == "bias: must be rank 1, got rank 2");
  g = ok_args();
  g.bias.strides[0] = 2;
  CHECK(msg(g) == "bias: must be contiguous (stride 1), got stride 2");
  g = ok_args();
  g.bias.data = nullptr;  // no data: no bias (a rank-1 description is a bias only for pretune)
  CHECK(msg(g) == "ok");
}
