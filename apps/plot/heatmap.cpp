// Heatmap grids (see heatmap.h): lay out, rasterise into an RGB buffer, encode with libpng in
// memory and write atomically.
#include "apps/plot/heatmap.h"

#include <png.h>

// stb_easy_font is all static functions, some of which go unused here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_easy_font.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/error.h"
#include "engine/file_io.h"

namespace plot {
namespace {

// viridis at t = k/32, k = 0..32, from matplotlib's _viridis_data (CC0), linearly interpolated
// there; interpolating these anchors stays within 3 of every one of matplotlib's 256 entries.
constexpr uint8_t kViridis[33][3] = {
    {68, 1, 84},    {71, 13, 96},   {72, 24, 106},  {72, 35, 116},  {71, 45, 123},  {69, 54, 129},
    {66, 64, 134},  {63, 73, 137},  {59, 82, 139},  {55, 90, 141},  {51, 99, 141},  {47, 106, 142},
    {44, 114, 142}, {41, 122, 142}, {38, 129, 142}, {35, 137, 142}, {33, 144, 140}, {31, 152, 139},
    {31, 159, 136}, {33, 166, 133}, {40, 174, 128}, {49, 181, 123}, {62, 188, 116}, {76, 194, 108},
    {93, 201, 99},  {110, 206, 88}, {130, 211, 76}, {150, 216, 63}, {171, 220, 50}, {192, 223, 36},
    {213, 226, 26}, {234, 229, 26}, {253, 231, 37}};

constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrey{128, 128, 128};

// Layout constants, in pixels. Text is stb_easy_font scaled by an integer: glyphs are 9 units tall
// with descenders, digits 7.
constexpr int64_t kMargin = 16, kGap = 6, kPanelGapX = 24, kPanelGapY = 18;
constexpr int64_t kBarGap = 28, kBarWidth = 20, kBarMinHeight = 200, kTickLen = 4;
// Tick labels clear of their tick marks, which would otherwise read as minus signs.
constexpr int64_t kTickLabelGap = 8;
constexpr int64_t kTitleScale = 2, kTextScale = 2, kTickScale = 2;
constexpr int64_t kGlyphHeight = 9, kDigitHeight = 7;
constexpr int64_t kMaxPanelSide = 16384, kMaxPixels = int64_t(1) << 27,
                  kMaxCells = int64_t(1) << 40;

// stb_easy_font indexes its tables by (c - 32): keep to printable ASCII.
std::string printable(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c < 32 || c > 126) c = '?';
  return out;
}

int64_t text_width(const std::string& s, int64_t scale) {
  std::string t = printable(s);
  return s.empty() ? 0 : int64_t(stb_easy_font_width(t.data())) * scale;
}

// Integers without decimals, otherwise 3 significant digits; "+ 0.0" turns -0 into 0.
std::string format_tick(double v) {
  char buf[32];
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e9)
    std::snprintf(buf, sizeof(buf), "%.0f", v + 0.0);
  else
    std::snprintf(buf, sizeof(buf), "%.3g", v + 0.0);
  return buf;
}

std::string format_bar(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v + 0.0);
  return buf;
}

struct Canvas {
  int64_t width, height;
  std::vector<uint8_t> rgb;
  Canvas(int64_t w, int64_t h) : width(w), height(h), rgb(size_t(w * h * 3), 255) {}
  // Fills [x0, x1) x [y0, y1), clipped to the image.
  void fill(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c) {
    x0 = std::max<int64_t>(x0, 0), y0 = std::max<int64_t>(y0, 0);
    x1 = std::min(x1, width), y1 = std::min(y1, height);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) {
        uint8_t* p = &rgb[size_t((y * width + x) * 3)];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
      }
  }
  // A 1-px outline just outside the box [x, x+w) x [y, y+h).
  void frame(int64_t x, int64_t y, int64_t w, int64_t h, Rgb c) {
    fill(x - 1, y - 1, x + w + 1, y, c);
    fill(x - 1, y + h, x + w + 1, y + h + 1, c);
    fill(x - 1, y, x, y + h, c);
    fill(x + w, y, x + w + 1, y + h, c);
  }
  // stb_easy_font emits axis-aligned quads (4 vertices of x, y, z floats + 4 colour bytes): fill
  // each one's bounding rectangle, scaled, with (x, y) the top-left of the text.
  void text(int64_t x, int64_t y, const std::string& s, int64_t scale, Rgb c) {
    if (s.empty()) return;
    std::string t = printable(s);
    std::vector<char> quads(t.size() * 1024 + 64);  // at most ~10 quads of 64 bytes per glyph
    const int n = stb_easy_font_print(0, 0, t.data(), nullptr, quads.data(), int(quads.size()));
    for (int q = 0; q < n; ++q) {
      float x0 = 1e9f, y0 = 1e9f, x1 = -1e9f, y1 = -1e9f;
      for (int v = 0; v < 4; ++v) {
        const float* xy = reinterpret_cast<const float*>(quads.data() + (q * 4 + v) * 16);
        x0 = std::min(x0, xy[0]), x1 = std::max(x1, xy[0]);
        y0 = std::min(y0, xy[1]), y1 = std::max(y1, xy[1]);
      }
      fill(x + int64_t(std::lround(x0)) * scale, y + int64_t(std::lround(y0)) * scale,
           x + int64_t(std::lround(x1)) * scale, y + int64_t(std::lround(y1)) * scale, c);
    }
  }
};

// The cell index under each pixel of an axis `pixels` long split into `cells`: exact blocks
// [floor(c*P/N), floor((c+1)*P/N)) when every cell gets a pixel, nearest sampling otherwise.
std::vector<int64_t> cell_of_pixel(int64_t pixels, int64_t cells) {
  std::vector<int64_t> out(size_t(pixels), 0);
  for (int64_t p = 0; p < pixels; ++p)
    out[size_t(p)] = cells <= pixels ? ((p + 1) * cells - 1) / pixels : p * cells / pixels;
  return out;
}

// Shared geometry of every grid slot, derived once from the options and all the panels.
struct Slots {
  int64_t ncol, nrow, label_w, inner_w, title_band, pitch_x, pitch_y, grid_top;
};

Slots slots_of(const std::vector<Panel>& panels, const GridOptions& o) {
  Slots s{};
  const int64_t n = int64_t(panels.size());
  s.ncol = std::min(o.columns, n);
  s.nrow = (n + s.ncol - 1) / s.ncol;
  int64_t title_w = 0;
  for (const Panel& p : panels) {
    s.label_w = std::max({s.label_w, text_width(format_tick(p.row_start), kTickScale),
                          text_width(format_tick(p.row_start + double(p.rows - 1)), kTickScale)});
    // Tiny boxes: the left column label (drawn from the box's left edge) must not reach the next
    // slot.
    title_w = std::max({title_w, text_width(p.title, kTextScale),
                        2 * text_width(format_tick(p.col_start), kTickScale)});
  }
  s.inner_w = std::max(o.panel_width + 2, title_w);
  // Room above each box for its title, and for the colour-bar label clear of the top tick label.
  s.title_band = std::max(kGlyphHeight * kTextScale + kGap,
                          kGlyphHeight * kTextScale + kDigitHeight * kTickScale / 2 + 4) +
                 1;
  s.pitch_x = s.label_w + kGap + s.inner_w + kPanelGapX;
  s.pitch_y = s.title_band + o.panel_height + 1 + kGap + kDigitHeight * kTickScale + kPanelGapY;
  s.grid_top = kMargin;
  if (!o.title.empty()) s.grid_top += kGlyphHeight * kTitleScale + kGap;
  if (!o.subtitle.empty()) s.grid_top += kGlyphHeight * kTextScale + kGap;
  s.grid_top += kGap;
  return s;
}

void validate(const std::vector<Panel>& panels, const GridOptions& o) {
  ENGINE_CHECK(!panels.empty(), "[plot] no panels to draw");
  ENGINE_CHECK(o.columns >= 1, "[plot] columns must be >= 1, got ", o.columns);
  ENGINE_CHECK(o.panel_width >= 1 && o.panel_height >= 1 && o.panel_width <= kMaxPanelSide &&
                   o.panel_height <= kMaxPanelSide,
               "[plot] panel_width and panel_height must be >= 1 (and <= ", kMaxPanelSide,
               "), got ", o.panel_width, " x ", o.panel_height);
  ENGINE_CHECK(o.separate_first >= 0, "[plot] separate_first must be >= 0, got ", o.separate_first);
  ENGINE_CHECK(!o.has_range || (std::isfinite(o.range_min) && std::isfinite(o.range_max) &&
                                o.range_max > o.range_min),
               "[plot] range_max (", o.range_max, ") must be greater than range_min (", o.range_min,
               ") and both finite");
  for (size_t i = 0; i < panels.size(); ++i) {
    const Panel& p = panels[i];
    ENGINE_CHECK(p.rows >= 1 && p.cols >= 1, "[plot] panel ", i, " (\"", p.title, "\") has ",
                 p.rows, " rows and ", p.cols, " cols; rows and cols must be >= 1");
    ENGINE_CHECK(p.rows <= kMaxCells / p.cols, "[plot] panel ", i, " (\"", p.title, "\") has ",
                 p.rows, " x ", p.cols, " cells, more than ", kMaxCells);
    ENGINE_CHECK(p.values.size() == size_t(p.rows * p.cols), "[plot] panel ", i, " (\"", p.title,
                 "\") has ", p.values.size(), " values, expected rows*cols = ", p.rows, "*", p.cols,
                 " = ", p.rows * p.cols);
  }
}

bool in_separate(const GridOptions& o, int64_t r, int64_t c) {
  return r < o.separate_first || c < o.separate_first;
}

}  // namespace

Rgb viridis(double t) {
  if (!(t > 0)) t = 0;  // also NaN
  if (t > 1) t = 1;
  const double x = t * 32;
  const int k = std::min(int(x), 31);
  const double f = x - k;
  auto mix = [&](int ch) {
    return uint8_t(std::lround(kViridis[k][ch] + (kViridis[k + 1][ch] - kViridis[k][ch]) * f));
  };
  return {mix(0), mix(1), mix(2)};
}

GridLayout layout_grid(const std::vector<Panel>& panels, const GridOptions& o) {
  validate(panels, o);
  GridLayout l;
  // min/max over the finite cells that are (first) or are not (!first) in the separate rows and
  // columns.
  auto range_of = [&](bool first, double& rmin, double& rmax) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const Panel& p : panels)
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t c = 0; c < p.cols; ++c) {
          if (in_separate(o, r, c) != first) continue;
          const float v = p.values[size_t(r * p.cols + c)];
          if (std::isfinite(v)) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
        }
    if (lo > hi) lo = 0, hi = 1;  // nothing finite: any range will do
    if (lo == hi) lo -= 0.5, hi += 0.5;
    rmin = lo, rmax = hi;
  };
  if (o.has_range)
    l.range_min = o.range_min, l.range_max = o.range_max;
  else
    range_of(false, l.range_min, l.range_max);
  if (o.separate_first > 0) range_of(true, l.range2_min, l.range2_max);

  const Slots s = slots_of(panels, o);
  for (int64_t i = 0; i < int64_t(panels.size()); ++i) {
    const int64_t gx = i % s.ncol, gy = i / s.ncol;
    const int64_t x = kMargin + gx * s.pitch_x + s.label_w + kGap + (s.inner_w - o.panel_width) / 2;
    l.panel_origin.push_back({x, s.grid_top + gy * s.pitch_y + s.title_band});
  }
  const int64_t grid_right = kMargin + s.ncol * s.pitch_x - kPanelGapX;
  const int64_t grid_bottom = s.grid_top + s.nrow * s.pitch_y - kPanelGapY;

  l.colorbar_x = grid_right + kBarGap;
  l.colorbar_y = s.grid_top + s.title_band;
  l.colorbar_width = kBarWidth;
  l.colorbar_height = std::max((s.nrow - 1) * s.pitch_y + o.panel_height, kBarMinHeight);
  auto bar_extent = [&](int64_t x, double lo, double hi, const std::string& label) {
    int64_t tick_w = 0;
    for (int k = 0; k <= 4; ++k)
      tick_w = std::max(tick_w, text_width(format_bar(lo + (hi - lo) * k / 4), kTickScale));
    return std::max(x + kBarWidth + 1 + kTickLen + kTickLabelGap + tick_w,
                    x + text_width(label, kTextScale));
  };
  int64_t bar_right = bar_extent(l.colorbar_x, l.range_min, l.range_max, o.colorbar_label);
  if (o.separate_first > 0) {
    l.colorbar2_x = bar_right + kBarGap;
    l.colorbar2_y = l.colorbar_y;
    bar_right = bar_extent(l.colorbar2_x, l.range2_min, l.range2_max, o.separate_label);
  }
  const int64_t titles_w =
      std::max(text_width(o.title, kTitleScale), text_width(o.subtitle, kTextScale));
  l.width = std::max(bar_right + kMargin, titles_w + 2 * kMargin);
  l.height =
      std::max(grid_bottom, l.colorbar_y + l.colorbar_height + kDigitHeight * kTickScale) + kMargin;
  ENGINE_CHECK(l.width * l.height <= kMaxPixels, "[plot] image of ", l.width, " x ", l.height,
               " pixels is too large (at most ", kMaxPixels, " pixels)");
  return l;
}

GridLayout write_heatmap_grid(const std::string& path, const std::vector<Panel>& panels,
                              const GridOptions& o) {
  const GridLayout l = layout_grid(panels, o);
  const Slots s = slots_of(panels, o);
  Canvas cv(l.width, l.height);
  const double span = l.range_max - l.range_min, span2 = l.range2_max - l.range2_min;
  auto colour = [&](double v, int64_t r, int64_t c) {
    if (!std::isfinite(v)) return kGrey;
    return in_separate(o, r, c) ? viridis((v - l.range2_min) / span2)
                                : viridis((v - l.range_min) / span);
  };

  // Titles, centred on the image.
  int64_t y = kMargin;
  if (!o.title.empty()) {
    cv.text((l.width - text_width(o.title, kTitleScale)) / 2, y, o.title, kTitleScale, kBlack);
    y += kGlyphHeight * kTitleScale + kGap;
  }
  if (!o.subtitle.empty())
    cv.text((l.width - text_width(o.subtitle, kTextScale)) / 2, y, o.subtitle, kTextScale, kBlack);

  const int64_t W = o.panel_width, H = o.panel_height, digit_h = kDigitHeight * kTickScale;
  for (size_t i = 0; i < panels.size(); ++i) {
    const Panel& p = panels[i];
    const int64_t x0 = l.panel_origin[i][0], y0 = l.panel_origin[i][1];
    const std::vector<int64_t> col_of = cell_of_pixel(W, p.cols), row_of = cell_of_pixel(H, p.rows);
    for (int64_t py = 0; py < H; ++py)
      for (int64_t px = 0; px < W; ++px) {
        const int64_t r = row_of[size_t(py)], c = col_of[size_t(px)];
        cv.fill(x0 + px, y0 + py, x0 + px + 1, y0 + py + 1,
                colour(p.values[size_t(r * p.cols + c)], r, c));
      }
    cv.frame(x0, y0, W, H, kBlack);
    cv.text(x0 + (W - text_width(p.title, kTextScale)) / 2, y0 - s.title_band + 1, p.title,
            kTextScale, kBlack);

    // Tick labels at the box's corners; the far one only where it does not collide with the near
    // one.
    const std::string r0 = format_tick(p.row_start),
                      r1 = format_tick(p.row_start + double(p.rows - 1));
    const int64_t label_right = x0 - 1 - kGap;
    cv.text(label_right - text_width(r0, kTickScale), y0, r0, kTickScale, kBlack);
    if (p.rows > 1 && H >= 2 * digit_h + 4)
      cv.text(label_right - text_width(r1, kTickScale), y0 + H - digit_h, r1, kTickScale, kBlack);
    const std::string c0 = format_tick(p.col_start),
                      c1 = format_tick(p.col_start + double(p.cols - 1));
    const int64_t label_y = y0 + H + 1 + kGap;
    cv.text(x0, label_y, c0, kTickScale, kBlack);
    if (p.cols > 1 && text_width(c0, kTickScale) + kGap + text_width(c1, kTickScale) <= W)
      cv.text(x0 + W - text_width(c1, kTickScale) + kTickScale, label_y, c1, kTickScale, kBlack);
  }

  // The colour bar(s): top row the maximum, bottom row the minimum, 5 ticks on the right.
  auto bar = [&](int64_t bx, int64_t by, double lo, double hi, const std::string& label) {
    const int64_t bh = l.colorbar_height;
    for (int64_t r = 0; r < bh; ++r)
      cv.fill(bx, by + r, bx + kBarWidth, by + r + 1, viridis(1.0 - double(r) / double(bh - 1)));
    cv.frame(bx, by, kBarWidth, bh, kBlack);
    for (int k = 0; k <= 4; ++k) {
      const int64_t ty = by + std::lround((1.0 - k / 4.0) * double(bh - 1));
      cv.fill(bx + kBarWidth + 1, ty, bx + kBarWidth + 1 + kTickLen, ty + 1, kBlack);
      cv.text(bx + kBarWidth + 1 + kTickLen + kTickLabelGap, ty - digit_h / 2,
              format_bar(lo + (hi - lo) * k / 4), kTickScale, kBlack);
    }
    cv.text(bx, by - 1 - digit_h / 2 - 4 - kGlyphHeight * kTextScale, label, kTextScale, kBlack);
  };
  bar(l.colorbar_x, l.colorbar_y, l.range_min, l.range_max, o.colorbar_label);
  if (o.separate_first > 0)
    bar(l.colorbar2_x, l.colorbar2_y, l.range2_min, l.range2_max, o.separate_label);

  // Encode in memory with libpng's simplified API (no setjmp), then write atomically.
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = png_uint_32(l.width);
  image.height = png_uint_32(l.height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  bool ok = png_image_write_to_memory(&image, nullptr, &size, 0, cv.rgb.data(), 0, nullptr) != 0;
  std::string bytes(ok ? size_t(size) : 0, '\0');
  ok = ok &&
       png_image_write_to_memory(&image, bytes.data(), &size, 0, cv.rgb.data(), 0, nullptr) != 0;
  const std::string message = image.message;
  png_image_free(&image);
  ENGINE_CHECK(ok, "[plot] ", path, ": PNG encoding failed (", message, ")");
  bytes.resize(size_t(size));
  engine::write_file_atomic(path, bytes, "plot");
  return l;
}

}  // namespace plot
