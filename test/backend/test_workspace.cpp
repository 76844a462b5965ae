// The backend's scratch memory (core/workspace.hpp): nested frames take
// disjoint, aligned memory and give it back when they end; memory in use
// never moves while the workspace grows; once a call's shapes have been
// seen the workspace is one buffer of the high-water size, and the same
// call again takes the same addresses without growing.
#include <boost/test/unit_test.hpp>

#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/workspace.hpp"

#include <cstdint>
#include <vector>

BOOST_AUTO_TEST_SUITE(test_workspace)

using namespace xfmr;
using Ws = Workspace<Buffer<float>>;

namespace {
bool aligned(const float* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

// A backward pass's pattern: an outer frame, then two inner ones in turn,
// the second larger than the first. Fills each take and checks the outer
// one still holds its values after the inner frames. The addresses taken.
std::vector<const float*> nested_call(Ws& ws, int scale) {
  std::vector<const float*> at;
  auto outer = ws.frame();
  float* a = outer.take(100 * scale);
  std::fill_n(a, 100 * scale, 1.0f);
  at.push_back(a);
  for (int inner_size : {300 * scale, 5000 * scale}) {
    auto inner = ws.frame();
    float* b = inner.take(inner_size);
    float* c = inner.take(7);
    std::fill_n(b, inner_size, 2.0f);
    std::fill_n(c, 7, 3.0f);
    BOOST_TEST((b >= a + 100 * scale || b + inner_size <= a), "an inner take overlaps the outer one");
    BOOST_TEST((c >= b + inner_size || c + 7 <= b), "two takes of one frame overlap");
    BOOST_TEST(aligned(b));
    BOOST_TEST(aligned(c));
    at.push_back(b);
    at.push_back(c);
  }
  for (int i = 0; i < 100 * scale; ++i)
    if (a[i] != 1.0f) {
      BOOST_ERROR("the outer take moved or was overwritten at " << i);
      break;
    }
  return at;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_frame_gives_its_memory_back_when_it_ends) {
  Ws ws;
  const float* first;
  {
    auto f = ws.frame();
    first = f.take(1000);
    BOOST_TEST(aligned(first));
  }
  auto g = ws.frame();
  BOOST_TEST(g.take(1000) == first);  // the same memory again
  const auto rows = g.rows<8>(3);
  BOOST_TEST(rows.rows == 3);
  BOOST_TEST((rows.data >= first + 1000 || rows.data + 24 <= first));  // apart from the take still in use
}

BOOST_AUTO_TEST_CASE(growth_keeps_memory_in_use_and_ends_in_one_buffer) {
  Ws ws;
  {
    auto outer = ws.frame();
    outer.take(10);
    {
      auto inner = ws.frame();
      inner.take(100000);  // past the first buffer: another one after it
      BOOST_TEST(ws.buffers() == 2u);
    }
    BOOST_TEST(ws.buffers() == 2u);  // nothing replaced while a frame is open
  }
  BOOST_TEST(ws.buffers() == 1u);
  BOOST_TEST(ws.capacity() >= ws.high_water());
  BOOST_TEST(ws.high_water() >= 100000u + 10u);
}

BOOST_AUTO_TEST_CASE(the_same_call_again_takes_the_same_memory) {
  Ws ws;
  nested_call(ws, 1);                 // grows, then one buffer
  const auto second = nested_call(ws, 1);
  const std::size_t capacity = ws.capacity();
  BOOST_TEST(ws.buffers() == 1u);
  for (int i = 0; i < 3; ++i) BOOST_TEST((nested_call(ws, 1) == second));
  BOOST_TEST(ws.capacity() == capacity);
  // The two inner frames follow each other: they start at the same place.
  BOOST_TEST(second[1] == second[3]);
  // A larger call grows it again, and settles again.
  nested_call(ws, 3);
  const auto larger = nested_call(ws, 3);
  BOOST_TEST(ws.buffers() == 1u);
  BOOST_TEST(ws.capacity() > capacity);
  BOOST_TEST((nested_call(ws, 3) == larger));
}

BOOST_AUTO_TEST_CASE(a_copy_starts_empty_and_assignment_needs_no_open_frame) {
  Ws ws;
  nested_call(ws, 1);
  Ws copy(ws);
  BOOST_TEST(copy.capacity() == 0u);
  BOOST_TEST(copy.high_water() == 0u);
  Ws other;
  {
    auto f = other.frame();
    f.take(10);
    const std::string e = test::error_of([&] { other = ws; });
    BOOST_TEST(e.find("1 frames use it") != std::string::npos, e);
  }
  other = ws;
  BOOST_TEST(other.capacity() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
