// Plain, xz and gzip text input (see text_input.h).
#include "data/text_input.h"

#include <lzma.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/error.h"

namespace data {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

struct TextFile::Impl {
  enum class Kind { plain, xz, gzip };
  std::string path, tag;
  FILE* file = nullptr;
  Kind kind = Kind::plain;
  lzma_stream xz = LZMA_STREAM_INIT;
  z_stream gz{};
  std::vector<uint8_t> inbuf;
  bool in_eof = false, finished = false;
  uint64_t consumed = 0;

  size_t fill() {  // more compressed input; returns the bytes read
    const size_t n = std::fread(inbuf.data(), 1, inbuf.size(), file);
    ENGINE_CHECK(n == inbuf.size() || !std::ferror(file), tag, " error reading ", path, ": ",
                 errno_text());
    consumed += n;
    in_eof = n < inbuf.size();
    return n;
  }

  size_t read_xz(char* dst, size_t cap) {
    xz.next_out = reinterpret_cast<uint8_t*>(dst);
    xz.avail_out = cap;
    while (xz.avail_out == cap) {
      if (xz.avail_in == 0 && !in_eof) {
        xz.avail_in = fill();
        xz.next_in = inbuf.data();
      }
      const lzma_action action = (in_eof && xz.avail_in == 0) ? LZMA_FINISH : LZMA_RUN;
      const lzma_ret ret = lzma_code(&xz, action);
      if (ret == LZMA_STREAM_END) {
        finished = true;
        break;
      }
      if (ret != LZMA_OK) {
        const char* why = ret == LZMA_MEM_ERROR      ? "out of memory"
                          : ret == LZMA_FORMAT_ERROR ? "not in the xz format"
                          : ret == LZMA_DATA_ERROR   ? "corrupt data"
                          : ret == LZMA_BUF_ERROR    ? "truncated file"
                                                     : "decoder error";
        ENGINE_FAIL(tag, " cannot decompress ", path, ": ", why, " (lzma error ",
                    static_cast<int>(ret), "; expected a complete .xz stream)");
      }
    }
    return cap - xz.avail_out;
  }

  size_t read_gzip(char* dst, size_t cap) {
    gz.next_out = reinterpret_cast<Bytef*>(dst);
    gz.avail_out = static_cast<uInt>(cap);
    while (gz.avail_out == cap) {
      if (gz.avail_in == 0) {
        if (in_eof) {
          ENGINE_FAIL(tag, " cannot decompress ", path,
                      ": truncated file (the gzip stream ends early; expected a complete .gz)");
        }
        gz.avail_in = static_cast<uInt>(fill());
        gz.next_in = inbuf.data();
        if (gz.avail_in == 0) continue;
      }
      const int ret = inflate(&gz, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) {
        // Concatenated members (cat a.gz b.gz) continue; the end of the file ends the text.
        if (gz.avail_in == 0 && !in_eof) {
          gz.avail_in = static_cast<uInt>(fill());
          gz.next_in = inbuf.data();
        }
        if (gz.avail_in == 0) {
          finished = true;
          break;
        }
        inflateReset(&gz);
        continue;
      }
      if (ret != Z_OK && !(ret == Z_BUF_ERROR && gz.avail_in == 0)) {
        const char* why = ret == Z_DATA_ERROR  ? "corrupt data"
                          : ret == Z_MEM_ERROR ? "out of memory"
                                               : "decoder error";
        ENGINE_FAIL(tag, " cannot decompress ", path, ": ", why, " (zlib error ", ret,
                    gz.msg ? std::string(": ") + gz.msg : std::string(),
                    "; expected a complete .gz stream)");
      }
    }
    return cap - gz.avail_out;
  }
};

TextFile::TextFile(const std::string& path, std::string tag) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.tag = std::move(tag);
  m.file = std::fopen(path.c_str(), "rb");
  ENGINE_CHECK(m.file != nullptr, m.tag, " cannot open input file ", path, ": ", errno_text());
  static constexpr unsigned char kXzMagic[6] = {0xFD, '7', 'z', 'X', 'Z', 0x00};
  unsigned char head[6] = {};
  const size_t got = std::fread(head, 1, sizeof(head), m.file);
  std::rewind(m.file);
  if (got == sizeof(head) && std::memcmp(head, kXzMagic, sizeof(head)) == 0) {
    m.kind = Impl::Kind::xz;
    const lzma_ret ret = lzma_stream_decoder(&m.xz, UINT64_MAX, LZMA_CONCATENATED);
    ENGINE_CHECK(ret == LZMA_OK, m.tag, " cannot start the xz decoder for ", path, " (lzma error ",
                 static_cast<int>(ret), ")");
  } else if (got >= 2 && head[0] == 0x1F && head[1] == 0x8B) {
    m.kind = Impl::Kind::gzip;
    const int ret = inflateInit2(&m.gz, 15 + 16);  // gzip wrapper only
    ENGINE_CHECK(ret == Z_OK, m.tag, " cannot start the gzip decoder for ", path, " (zlib error ",
                 ret, ")");
  }
  if (m.kind != Impl::Kind::plain) m.inbuf.resize(1 << 16);
}

TextFile::~TextFile() {
  Impl& m = *impl_;
  if (m.kind == Impl::Kind::xz) lzma_end(&m.xz);
  if (m.kind == Impl::Kind::gzip) inflateEnd(&m.gz);
  if (m.file) std::fclose(m.file);
}

const std::string& TextFile::path() const { return impl_->path; }
bool TextFile::compressed() const { return impl_->kind != Impl::Kind::plain; }
uint64_t TextFile::consumed() const { return impl_->consumed; }

size_t TextFile::read(char* dst, size_t cap) {
  Impl& m = *impl_;
  if (m.kind == Impl::Kind::plain) {
    const size_t n = std::fread(dst, 1, cap, m.file);
    ENGINE_CHECK(n == cap || !std::ferror(m.file), m.tag, " error reading ", m.path, ": ",
                 errno_text());
    m.consumed += n;
    return n;
  }
  if (m.finished || cap == 0) return 0;
  return m.kind == Impl::Kind::xz ? m.read_xz(dst, cap) : m.read_gzip(dst, cap);
}

TextLines::TextLines(TextFile& in) : in_(in), buf_(1 << 20) {}

bool TextLines::next(std::string& line) {
  line.clear();
  bool got = false;
  for (;;) {
    if (pos_ == end_) {
      if (eof_) break;
      end_ = in_.read(buf_.data(), buf_.size());
      pos_ = 0;
      if (end_ == 0) {
        eof_ = true;
        break;
      }
    }
    got = true;
    const char* start = buf_.data() + pos_;
    const void* nl = std::memchr(start, '\n', end_ - pos_);
    if (nl) {
      const size_t len = static_cast<const char*>(nl) - start;
      line.append(start, len);
      pos_ += len + 1;
      break;
    }
    line.append(start, end_ - pos_);
    pos_ = end_;
  }
  if (!got) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (first_) {
    first_ = false;
    if (line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 byte-order mark
  }
  return true;
}

}  // namespace data
