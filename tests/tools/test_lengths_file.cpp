// Readers of lengths files and batches files: accepted syntax, and messages for bad lines.
#include <gtest/gtest.h>

#include <fstream>

#include "support/expect_error.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"

namespace thdcp {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/thdcp_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

using test::expect_error;

// A file's text and the parts its error must hold (besides the file's path).
struct BadFile {
  const char* text;
  std::vector<std::string> parts;
};

// Writes each case to a file of its own and expects `read` to reject it with its parts.
template <typename Read>
void expect_rejected(const std::string& prefix, const std::vector<BadFile>& cases, Read read) {
  int index = 0;
  for (const BadFile& c : cases) {
    const std::string path = write_temp(prefix + std::to_string(index++) + ".txt", c.text);
    std::vector<std::string> parts = c.parts;
    parts.push_back(path);
    expect_error([&] { read(path); }, parts);
  }
}

TEST(LengthsFile, ReadsLengthsCommentsAndBlankLines) {
  const std::string path = write_temp("lengths_ok.txt", "# header\n12\n\n  7  # trailing comment\r\n+3\n\t\n1024\n");
  const DocumentLengths d = read_lengths_file(path);
  EXPECT_EQ(d.source, path);
  EXPECT_EQ(d.lengths, (std::vector<int64_t>{12, 7, 3, 1024}));
  EXPECT_EQ(d.lines, (std::vector<int64_t>{2, 4, 5, 7}));
}

TEST(LengthsFile, RejectsBadLinesNamingFileLineAndText) {
  expect_error([] { read_lengths_file("/nonexistent/lengths.txt"); }, {"/nonexistent/lengths.txt", "cannot open"});
  expect_rejected("lengths_bad", {
      {"5\n-3\n", {":2:", "'-3' is negative"}},
      {"5\n\n12x\n", {":3:", "'12x' is not a document length"}},
      {"0\n", {":1:", "'0' is a zero-length document"}},
      {"4 5\n", {":1:", "'4 5' holds more than one value", "batches file"}},
      {"99999999999\n", {":1:", "'99999999999'", "2^31-1"}},
      {"# only comments\n\n", {"no document lengths"}},
      {"1.5\n", {":1:", "'1.5' is not a document length"}},
  }, read_lengths_file);
}

TEST(BatchesFile, ReadsSpacesCommasAndComments) {
  const std::string path = write_temp("batches_ok.txt", "# batches\n1 2 3\n\n4,5, 6\n7\t8 # comment\n 9 , 10 \r\n");
  const DocumentBatches b = read_batches_file(path);
  EXPECT_EQ(b.batches, (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 5, 6}, {7, 8}, {9, 10}}));
  EXPECT_EQ(b.lines, (std::vector<int64_t>{2, 4, 5, 6}));
  const PackingSize size = count_batches_file(path);
  EXPECT_EQ(size.batches, 4);
  EXPECT_EQ(size.documents, 10);
}

TEST(BatchesFile, RejectsBadFields) {
  expect_rejected("batches_bad", {
      {"1 2\n3,,4\n", {":2:", "empty field"}},
      {"1,\n", {":1:", "empty field"}},
      {", 1\n", {":1:", "empty field"}},
      {"1 a 2\n", {":1:", "'a' is not a document length"}},
      {"1 -2\n", {":1:", "'-2' is negative"}},
      {"3 0\n", {":1:", "zero-length"}},
      {"\n# nothing\n", {"no batches found"}},
  }, read_batches_file);
}

}  // namespace
}  // namespace thdcp
