#define BOOST_TEST_MODULE cuda_runtime
// The CUDA seam: xfmr_cuda links and answers device queries on any machine;
// on one with a GPU the device has a name.
#include <boost/test/unit_test.hpp>
#include <string>

#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"

BOOST_AUTO_TEST_CASE(device_queries) {
  const int n = xfmr::cuda::device_count();
  BOOST_TEST(n >= 0);
  try {
    (void)xfmr::cuda::device_name(n);  // one past the last device
    BOOST_FAIL("device ordinal " << n << " accepted");
  } catch (const xfmr::Error& e) {
    BOOST_TEST(std::string(e.what()) == "CUDA device " + std::to_string(n) + " out of range [0, " + std::to_string(n) + ")");
  }
  if (n > 0) BOOST_TEST(!xfmr::cuda::device_name(0).empty());
}
