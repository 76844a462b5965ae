#include "support/temp_dir.hpp"
#include "xfmr/io/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "xfmr/core/error.hpp"
#include "xfmr/text/text.hpp"

BOOST_AUTO_TEST_SUITE(test_safetensors)

using xfmr::test::TempDir;

using namespace xfmr;
namespace fs = std::filesystem;

namespace {

// A file from a raw header text and n data bytes (values 0, 1, 2, ...).
std::vector<std::byte> raw(const std::string& header, std::size_t data_bytes, std::uint64_t claimed_len = 0) {
  const std::uint64_t n = claimed_len ? claimed_len : header.size();
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = std::byte((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = std::byte(i & 0xff);
  return out;
}

// Parses and returns the error message ("" if it parsed).
std::string error_of(std::vector<std::byte> bytes) {
  try {
    SafeTensors::parse(std::move(bytes), "t.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }


}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_with_metadata) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  const std::vector<double> b = {3.141592653589793};
  const std::vector<std::int64_t> c = {-5, 1LL << 40};
  SafeTensorsWriter w;
  w.add<float>("blocks.0.attn.qkv.weight", {2, 3}, a);
  w.add<double>("scalar", {}, b);
  w.add<std::int64_t>("ids", {2}, c);
  w.set_metadata("config", "{\"D_MODEL\": 64}");
  const auto bytes = w.serialize();
  // Header length is a multiple of 8, so tensor data is 8-byte aligned.
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  BOOST_TEST(n % 8 == 0u);

  const auto st = SafeTensors::parse(bytes);
  BOOST_TEST((st.names() == std::vector<std::string>{"blocks.0.attn.qkv.weight", "scalar", "ids"}));
  BOOST_TEST(st.values<float>("blocks.0.attn.qkv.weight") == a, boost::test_tools::per_element());
  BOOST_TEST(st.values<double>("scalar") == b, boost::test_tools::per_element());
  BOOST_TEST(st.integers("ids") == c, boost::test_tools::per_element());
  BOOST_TEST((st.info("blocks.0.attn.qkv.weight").shape == std::vector<std::int64_t>{2, 3}));
  BOOST_TEST(st.info("scalar").shape.empty());
  BOOST_TEST(st.metadata().at("config") == "{\"D_MODEL\": 64}");
  std::vector<float> out(6);
  st.copy_to<float>("blocks.0.attn.qkv.weight", {2, 3}, out);
  BOOST_TEST(out == a, boost::test_tools::per_element());
  BOOST_CHECK_THROW(st.copy_to<float>("blocks.0.attn.qkv.weight", {3, 2}, out), Error);
  BOOST_CHECK_THROW(st.info("missing"), Error);
  BOOST_CHECK_THROW(st.values<float>("ids"), Error);  // integer tensor read as float
}

BOOST_AUTO_TEST_CASE(reads_half_precision) {
  // F16 0x3C00 = 1, 0xC000 = -2, 0x0001 = 2^-24 (subnormal); BF16 0x3FC0 = 1.5.
  const std::string h =
      R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]}})";
  auto bytes = raw(h, 8);
  const std::uint8_t data[8] = {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00, 0xC0, 0x3F};
  std::memcpy(bytes.data() + 8 + h.size(), data, 8);
  const auto st = SafeTensors::parse(bytes);
  BOOST_TEST(st.values<float>("h") == (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24)}),
             boost::test_tools::per_element());
  BOOST_TEST(st.values<float>("b") == std::vector<float>{1.5f}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(rejects_truncated_files) {
  BOOST_TEST(contains(error_of(std::vector<std::byte>(5)), "5 bytes, too short"));
  const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  BOOST_TEST(error_of(raw(h, 16)) == "");
  // Data cut short.
  const std::string cut = error_of(raw(h, 12));
  BOOST_TEST(contains(cut, "tensors end at data byte 16 but the file holds 12 data bytes"), cut);
  // Header length pointing past the end of the file.
  const std::string past = error_of(raw(h, 0, 1000));
  BOOST_TEST(contains(past, "header length 1000 runs past the end of the file"), past);
}

BOOST_AUTO_TEST_CASE(rejects_trailing_bytes) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  BOOST_TEST(contains(error_of(raw(h, 12)), "tensors end at data byte 8 but the file holds 12"));
}

BOOST_AUTO_TEST_CASE(rejects_oversized_header) {
  const std::string e = error_of(raw("{}", 0, 100'000'001));
  BOOST_TEST(contains(e, "header length 100000001 exceeds the limit of 100000000 bytes"), e);
}

BOOST_AUTO_TEST_CASE(rejects_overlapping_and_gapped_offsets) {
  const std::string overlap =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  const std::string e1 = error_of(raw(overlap, 12));
  BOOST_TEST(contains(e1, "tensor 'b' starts at byte 4 but the previous tensor ends at 8"), e1);
  const std::string gap =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  BOOST_TEST(contains(error_of(raw(gap, 12)), "tensor 'b' starts at byte 8 but the previous tensor ends at 4"));
  const std::string not_from_zero = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  BOOST_TEST(contains(error_of(raw(not_from_zero, 8)), "starts at byte 4 but the previous tensor ends at 0"));
  const std::string reversed = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})";
  BOOST_TEST(contains(error_of(raw(reversed, 4)), "begin after end"));
}

BOOST_AUTO_TEST_CASE(rejects_shape_size_mismatch_and_overflow) {
  const std::string mismatch = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})";
  const std::string e = error_of(raw(mismatch, 20));
  BOOST_TEST(contains(e, "tensor 'a' of dtype F32 and shape (2, 3) needs 24 bytes but data_offsets span 20"), e);
  const std::string huge =
      R"({"a":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})";
  BOOST_TEST(contains(error_of(raw(huge, 8)), "element count overflows"));
  const std::string bytes_overflow = R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})";
  BOOST_TEST(contains(error_of(raw(bytes_overflow, 8)), "overflows"));
}

BOOST_AUTO_TEST_CASE(rejects_malformed_headers) {
  BOOST_TEST(contains(error_of(raw("[1, 2]", 0)), "does not start with '{'"));
  BOOST_TEST(contains(error_of(raw("{\"a\": ", 0)), "not valid JSON"));
  const std::string dup =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  BOOST_TEST(contains(error_of(raw(dup, 8)), "duplicate key 'a'"));
  const std::string dup_meta = R"({"__metadata__":{"k":"1","k":"2"}})";
  BOOST_TEST(contains(error_of(raw(dup_meta, 0)), "duplicate key 'k'"));
  BOOST_TEST(contains(error_of(raw(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4)),
                      "unknown dtype 'F31'"));
  BOOST_TEST(contains(error_of(raw(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                      "not a non-negative integer: -1"));
  BOOST_TEST(contains(error_of(raw(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
                      "not a non-negative integer"));
  BOOST_TEST(contains(error_of(raw(R"({"a":{"dtype":"F32","shape":[1]}})", 4)), "needs data_offsets"));
  BOOST_TEST(contains(error_of(raw(R"({"__metadata__":{"k":1}})", 0)), "__metadata__ value for 'k' is not a string"));
  // A shape nested 100,000 deep overflowed the stack inside nlohmann-json
  // as the error message was built; the depth is bounded before parsing.
  const std::string deep = R"({"a":{"dtype":"F32","shape":)" + std::string(100000, '[') + std::string(100000, ']') +
                           R"(,"data_offsets":[0,4]}})";
  BOOST_TEST(contains(error_of(raw(deep, 4)), ": header nests deeper than 64 levels"));
  const std::string brackets_in_strings = R"({"__metadata__":{"k":")" + std::string(1000, '[') + R"("}})";
  BOOST_TEST(SafeTensors::parse(raw(brackets_in_strings, 0)).metadata("k") == std::string(1000, '['));
}

BOOST_AUTO_TEST_CASE(writer_rejects_bad_tensors) {
  SafeTensorsWriter w;
  const std::vector<float> v(6);
  w.add<float>("a", {2, 3}, v);
  BOOST_CHECK_THROW(w.add<float>("a", {6}, v), Error);             // duplicate
  BOOST_CHECK_THROW(w.add<float>("__metadata__", {6}, v), Error);  // reserved
  BOOST_CHECK_THROW(w.add<float>("b", {4}, v), Error);             // 6 elements, shape holds 4
}

BOOST_AUTO_TEST_CASE(atomic_write_replaces_and_never_damages) {
  TempDir dir;
  const fs::path path = dir.path / "model.safetensors";
  const std::vector<float> one = {1, 2, 3}, two = {4, 5};
  SafeTensorsWriter w1, w2;
  w1.add<float>("x", {3}, one);
  w2.add<float>("y", {2}, two);
  w1.write(path);
  BOOST_TEST(SafeTensors::load(path).values<float>("x") == one, boost::test_tools::per_element());
  w2.write(path);  // replaces
  const auto st = SafeTensors::load(path);
  BOOST_TEST(!st.contains("x"));
  BOOST_TEST(st.values<float>("y") == two, boost::test_tools::per_element());
  // A write into a directory that does not exist fails cleanly ...
  BOOST_CHECK_THROW(w1.write(dir.path / "missing" / "m.safetensors"), Error);
  // ... and a failing write leaves the existing file as it was, with no temporaries.
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  const bool can_still_write = ::access(dir.path.c_str(), W_OK) == 0;  // root ignores permissions
  if (!can_still_write) BOOST_CHECK_THROW(w1.write(path), Error);
  fs::permissions(dir.path, fs::perms::owner_all);
  BOOST_TEST(SafeTensors::load(path).values<float>("y") == two, boost::test_tools::per_element());
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  BOOST_TEST(files == 1u);
}

// A path that exists and is not a regular file is written through, never
// replaced (as root, a rename would have turned /dev/null, handed over as
// --metrics-json, into a regular file): a pipe stays a pipe and its reader
// gets the bytes; a directory is an error.
BOOST_AUTO_TEST_CASE(atomic_write_never_replaces_a_pipe_or_a_device) {
  TempDir dir;
  const fs::path fifo = dir.path / "pipe";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string received;
  std::thread reader([&] {
    std::ifstream in(fifo, std::ios::binary);
    received.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  });
  const std::string text = "{\"loss\": 1}\n";
  write_file_atomic(fifo, std::as_bytes(std::span<const char>(text.data(), text.size())));
  const bool still_a_pipe = fs::is_fifo(fifo);
  BOOST_TEST(still_a_pipe);
  if (!still_a_pipe) {  // replaced: the reader waits on the old pipe forever; fail, do not hang
    reader.detach();
    return;
  }
  reader.join();
  BOOST_TEST(received == text);
  BOOST_CHECK_THROW(write_file_atomic(dir.path, std::as_bytes(std::span<const char>(text.data(), text.size()))), Error);
  // (Not tried on /dev/null itself: a regression would replace it on the test machine.)
  // A FIFO that no process reads is an error, not a wait without end.
  try {
    write_file_atomic(fifo, std::as_bytes(std::span<const char>(text.data(), text.size())));
    BOOST_ERROR("a FIFO without a reader was written");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == fifo.string() + ": a FIFO that no process opened for reading in " +
                                            std::to_string(kFifoWaitSeconds) + " s");
  }
}

// Every write is checked to the end, with the system's reason and the
// user's path: a device that is full fails (small writes once vanished in
// a stream's buffer and the program exited 0). A replaced file keeps its
// permissions; "dir/" names the directory, not something inside it.
BOOST_AUTO_TEST_CASE(atomic_write_checks_every_write_and_keeps_the_mode) {
  const std::string text = "{\"loss\": 1}\n";
  const auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  if (fs::exists("/dev/full")) {
    try {
      write_file_atomic("/dev/full", bytes);
      BOOST_ERROR("writing /dev/full succeeded");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()) == "/dev/full: " + std::string(std::strerror(ENOSPC)));
    }
  }
  TempDir dir;
  const fs::path path = dir.path / "metrics.json";
  write_file_atomic(path, bytes);
  BOOST_TEST(((fs::status(path).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write |
                                                                    fs::perms::group_read | fs::perms::others_read)));
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);  // 0600
  write_file_atomic(path, bytes);
  BOOST_TEST(((fs::status(path).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write)));
  fs::create_directories(dir.path / "sub");
  write_file_atomic(dir.path / "sub" / "." / ".." / "m2.json", bytes);
  BOOST_TEST(fs::is_regular_file(dir.path / "m2.json"));
}

BOOST_AUTO_TEST_CASE(load_reports_missing_files) {
  try {
    SafeTensors::load("/nonexistent/x.safetensors");
    BOOST_FAIL("missing file loaded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "/nonexistent/x.safetensors: cannot open for reading");
  }
  // A directory opened as a stream reported a size of 2^63 - 1 and ended in
  // std::bad_alloc.
  try {
    (void)SafeTensors::load("/tmp");
    BOOST_FAIL("a directory loaded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "/tmp: is not a regular file");
  }
}

// Names and metadata go into the header's JSON: text that is not UTF-8 is
// an Error naming it when it is added, not an exception from the JSON
// writer when the file is written; metadata reads back from the header alone.
BOOST_AUTO_TEST_CASE(writer_refuses_what_json_cannot_hold) {
  SafeTensorsWriter w;
  const std::vector<float> v = {1};
  BOOST_CHECK_THROW(w.set_metadata("tokenizer", "caf\xe9"), Error);
  BOOST_CHECK_THROW(w.set_metadata("k", "\xed\xa0\x80"), Error);      // a surrogate
  BOOST_CHECK_THROW(w.set_metadata("k", "\xc0\xaf"), Error);          // an overlong '/'
  BOOST_CHECK_THROW(w.add<float>("w\xff", {1}, v), Error);
  w.set_metadata("note", "caf\xc3\xa9 \xf0\x9f\x98\x80");  // well-formed: accepted
  w.add<float>("w", {1}, v);
  const auto dir = std::filesystem::temp_directory_path() / ("xfmr_st_meta_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  w.write(dir / "m.safetensors");
  BOOST_TEST(SafeTensors::read_metadata(dir / "m.safetensors").at("note") == "caf\xc3\xa9 \xf0\x9f\x98\x80");
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
