#include "executor/data/index_file.h"

#include <limits>
#include <utility>

#include "core/error.h"
#include "core/fnv1a.h"

namespace megaplan::exec {

namespace {

constexpr char kMagic[8] = {'M', 'P', 'I', 'N', 'D', 'E', 'X', '1'};
constexpr uint64_t kFramingBytes = 32;  // magic, header size, checksum, text length
constexpr uint64_t kPage = 4096;
// A header holds a description and a few counts per dataset of a blend: far below this.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 26;

uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

uint64_t load_word(const unsigned char* at) {
  uint64_t value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

void put_word(std::string& bytes, uint64_t value) {
  char raw[sizeof value];
  std::memcpy(raw, &value, sizeof value);
  bytes.append(raw, sizeof value);
}

}  // namespace

int index_width(uint64_t largest) {
  if (largest <= std::numeric_limits<uint16_t>::max()) return 2;
  if (largest <= std::numeric_limits<uint32_t>::max()) return 4;
  return 8;
}

IndexFileWriter::IndexFileWriter(const std::string& path, nlohmann::json header,
                                 const std::vector<IndexSection>& sections)
    : file_(path), sections_(sections) {
  // The header's size depends on the offsets it lists: lay the sections out after a generous
  // estimate, and again after the text's real size until it fits.
  uint64_t header_bytes = kPage;
  std::string text;
  for (;;) {
    nlohmann::json layout = nlohmann::json::array();
    offsets_.clear();
    uint64_t offset = header_bytes;
    for (const IndexSection& section : sections_) {
      offsets_.push_back(offset);
      layout.push_back(
          {{"name", section.name}, {"width", section.width}, {"count", section.count}, {"offset", offset}});
      offset = round_up(offset + section.count * static_cast<uint64_t>(section.width), kPage);
    }
    header["sections"] = layout;
    header["file_bytes"] = offset;
    text = header.dump();
    if (kFramingBytes + text.size() <= header_bytes) break;
    header_bytes = round_up(kFramingBytes + text.size(), kPage);
  }
  std::string bytes(kMagic, sizeof kMagic);
  put_word(bytes, header_bytes);
  put_word(bytes, Fnv1a64().add(text).value());
  put_word(bytes, text.size());
  bytes += text;
  bytes.resize(header_bytes, '\0');
  file_.write_at(0, bytes.data(), bytes.size());
  // The padding after the last section is never written: its last byte gives the file its size.
  const auto file_bytes = header["file_bytes"].get<uint64_t>();
  if (file_bytes > header_bytes) {
    const char zero = 0;
    file_.write_at(file_bytes - 1, &zero, 1);
  }
}

void IndexFileWriter::write_bytes(std::size_t section, uint64_t first, const void* data, uint64_t count) {
  const auto width = static_cast<uint64_t>(sections_[section].width);
  file_.write_at(offsets_[section] + first * width, data, static_cast<std::size_t>(count * width));
}

MappedIndexFile::MappedIndexFile(const std::string& path, const std::string& field)
    : path_(path), field_(field), file_(path, field) {
  const uint64_t size = file_.size();
  const unsigned char* data = file_.data();
  if (size < kFramingBytes || std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    damaged("no index header (" + std::to_string(size) + " bytes, no MPINDEX1 magic)");
  }
  const uint64_t header_bytes = load_word(data + 8);
  const uint64_t checksum = load_word(data + 16);
  const uint64_t text_bytes = load_word(data + 24);
  if (header_bytes < kFramingBytes || header_bytes > size || header_bytes > kMaxHeaderBytes ||
      text_bytes > header_bytes - kFramingBytes) {
    damaged("its header's sizes (" + std::to_string(header_bytes) + " bytes, " + std::to_string(text_bytes) +
            " of text) do not fit the file's " + std::to_string(size) + " bytes");
  }
  const std::string_view text(reinterpret_cast<const char*>(data + kFramingBytes), text_bytes);
  if (Fnv1a64().add(text).value() != checksum) damaged("its header fails its checksum");
  try {
    header_ = nlohmann::json::parse(text);
    const auto file_bytes = header_.at("file_bytes").get<uint64_t>();
    if (file_bytes != size) {
      damaged(std::string(size < file_bytes ? "truncated" : "too long") + ": " + std::to_string(size) +
              " bytes, but its header says " + std::to_string(file_bytes));
    }
    for (const nlohmann::json& section : header_.at("sections")) {
      const auto width = section.at("width").get<uint64_t>();
      const auto count = section.at("count").get<uint64_t>();
      const auto offset = section.at("offset").get<uint64_t>();
      if ((width != 2 && width != 4 && width != 8) || offset % kPage != 0 || offset < header_bytes || offset > size ||
          count > (size - offset) / width) {
        damaged("section " + section.at("name").get<std::string>() + " does not fit the file");
      }
    }
    (void)header_.at("description");
    (void)header_.at("inputs");
    (void)header_.at("facts");
  } catch (const nlohmann::json::exception& error) {
    damaged(std::string("its header is not an index header: ") + error.what());
  }
  file_.advise_random_access();  // samples are read in shuffled order
}

PackedArray MappedIndexFile::section(const std::string& name) const {
  for (const nlohmann::json& section : header_.at("sections")) {
    if (section.at("name") != name) continue;
    return PackedArray(file_.data() + section.at("offset").get<uint64_t>(), section.at("width").get<int>(),
                       section.at("count").get<uint64_t>());
  }
  damaged("its header lists no section \"" + name + "\"");
}

void MappedIndexFile::damaged(const std::string& rule) const {
  throw SpecError(field_, path_ + ": " + rule + ": the cached index is damaged; delete it to build it again");
}

}  // namespace megaplan::exec
