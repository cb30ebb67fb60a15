// apps/plot/heatmap.h: every check decodes the written PNG with libpng and looks at real pixels.
#include <png.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "apps/plot/heatmap.h"
#include "engine/error.h"
#include "test_support.h"

using Catch::Contains;
using engine::testing::error_of;
using engine::testing::TempDir;

namespace {

using Color = std::array<int, 3>;  // printable by Catch, unlike plot::Rgb

Color rgb(plot::Rgb c) { return {c.r, c.g, c.b}; }

bool near(Color a, Color b, int tol) {
  for (int i = 0; i < 3; ++i)
    if (std::abs(a[i] - b[i]) > tol) return false;
  return true;
}

const Color kGrey{128, 128, 128}, kWhite{255, 255, 255}, kBlack{0, 0, 0};

struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Color at(int64_t x, int64_t y) const {
    REQUIRE((x >= 0 && x < width && y >= 0 && y < height));
    const uint8_t* p = &rgb[size_t((y * width + x) * 3)];
    return {p[0], p[1], p[2]};
  }
  // Pixels in [x0, x1) x [y0, y1) (clipped to the image) darker than mid grey: text and frames.
  int64_t dark(int64_t x0, int64_t y0, int64_t x1, int64_t y1) const {
    x0 = std::max<int64_t>(x0, 0), y0 = std::max<int64_t>(y0, 0);
    x1 = std::min(x1, width), y1 = std::min(y1, height);
    int64_t n = 0;
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) {
        const Color c = at(x, y);
        n += c[0] + c[1] + c[2] < 300;
      }
    return n;
  }
};

Image decode(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&image, path.c_str()) != 0);
  image.format = PNG_FORMAT_RGB;
  Image out;
  out.width = image.width, out.height = image.height;
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  REQUIRE(png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr) != 0);
  return out;
}

plot::Panel panel(std::string title, int64_t rows, int64_t cols, std::vector<float> values) {
  plot::Panel p;
  p.title = std::move(title), p.rows = rows, p.cols = cols, p.values = std::move(values);
  return p;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("viridis: matplotlib's endpoints, midpoint and quartiles, clamped outside [0, 1]",
          "[plot]") {
  CHECK(rgb(plot::viridis(0)) == Color{68, 1, 84});
  CHECK(rgb(plot::viridis(1)) == Color{253, 231, 37});
  // matplotlib's _viridis_data entries 128, 64, 192, 25 and 230 (t = index / 256), within 3.
  CHECK(near(rgb(plot::viridis(0.5)), {33, 145, 140}, 3));
  CHECK(near(rgb(plot::viridis(0.25)), {59, 82, 139}, 3));
  CHECK(near(rgb(plot::viridis(0.75)), {94, 201, 98}, 3));
  CHECK(near(rgb(plot::viridis(0.1)), {72, 36, 117}, 3));
  CHECK(near(rgb(plot::viridis(0.9)), {189, 223, 38}, 3));
  CHECK(rgb(plot::viridis(-0.5)) == rgb(plot::viridis(0)));
  CHECK(rgb(plot::viridis(7)) == rgb(plot::viridis(1)));
  CHECK(rgb(plot::viridis(std::nan(""))) == rgb(plot::viridis(0)));
}

TEST_CASE("write_heatmap_grid: cells, NaN, frames, colour bar and text land on the right pixels",
          "[plot]") {
  TempDir dir;
  // Panel 0: 0..15 row-major with a NaN at (2, 1); panel 1: the mid value, 0, the max and a
  // quarter.
  std::vector<float> v0(16);
  for (int i = 0; i < 16; ++i) v0[size_t(i)] = float(i);
  v0[2 * 4 + 1] = kNaN;
  std::vector<plot::Panel> panels{panel("head 1", 4, 4, v0),
                                  panel("head 2", 2, 2, {7.5f, 0, 15, 3.75f})};
  plot::GridOptions o;
  o.title = "Positional correlations";
  o.subtitle = "rows: query position i, columns: key position j";
  o.colorbar_label = "correlation";
  const std::string path = dir.file("grid.png");
  const plot::GridLayout l = plot::write_heatmap_grid(path, panels, o);
  CHECK(engine::testing::names_starting_with(dir.path, "grid.png.tmp").empty());
  const Image img = decode(path);
  REQUIRE(img.width == l.width);
  REQUIRE(img.height == l.height);
  CHECK(l.range_min == 0);
  CHECK(l.range_max == 15);
  REQUIRE(l.panel_origin.size() == 2);
  const plot::GridLayout again = plot::layout_grid(panels, o);
  CHECK(again.width == l.width);
  CHECK(again.panel_origin == l.panel_origin);

  // Panel 0: a 4x4 matrix in a 256 box is exactly 64-px blocks.
  const int64_t x0 = l.panel_origin[0][0], y0 = l.panel_origin[0][1];
  for (int64_t py = 0; py < 256; ++py)
    for (int64_t px = 0; px < 256; ++px) {
      const int64_t r = py / 64, c = px / 64;
      const Color want = r == 2 && c == 1 ? kGrey : rgb(plot::viridis((r * 4 + c) / 15.0));
      if (img.at(x0 + px, y0 + py) != want) FAIL("panel 0 pixel (" << px << ", " << py << ")");
    }
  CHECK(img.at(x0, y0) == rgb(plot::viridis(0)));
  CHECK(img.at(x0 + 255, y0 + 255) == rgb(plot::viridis(1)));
  CHECK(img.at(x0 + 64 + 10, y0 + 128 + 10) == kGrey);
  // The black frame is just outside the box.
  CHECK(img.at(x0 - 1, y0 + 100) == kBlack);
  CHECK(img.at(x0 + 256, y0 + 100) == kBlack);
  CHECK(img.at(x0 + 100, y0 - 1) == kBlack);
  CHECK(img.at(x0 + 100, y0 + 256) == kBlack);

  // Panel 1: 2x2 in 128-px blocks; 7.5 is the middle of the range.
  const int64_t x1 = l.panel_origin[1][0], y1 = l.panel_origin[1][1];
  CHECK(y1 == y0);
  CHECK(x1 > x0 + 256);
  CHECK(img.at(x1 + 127, y1 + 127) == rgb(plot::viridis(0.5)));
  CHECK(near(img.at(x1 + 5, y1 + 5), {33, 145, 140}, 3));
  CHECK(img.at(x1 + 128, y1) == rgb(plot::viridis(0)));
  CHECK(img.at(x1, y1 + 128) == rgb(plot::viridis(1)));
  CHECK(img.at(x1 + 255, y1 + 255) == rgb(plot::viridis(0.25)));

  // Colour bar: top row the maximum, bottom row the minimum, the middle in between.
  CHECK(l.colorbar_y == y0);  // spans the panels' boxes
  REQUIRE(l.colorbar_height == 256);
  CHECK(l.colorbar_x > x1 + 256);
  for (int64_t x = l.colorbar_x; x < l.colorbar_x + l.colorbar_width; ++x) {
    CHECK(img.at(x, l.colorbar_y) == rgb(plot::viridis(1)));
    CHECK(img.at(x, l.colorbar_y + l.colorbar_height - 1) == rgb(plot::viridis(0)));
  }
  const int64_t bar_mid = l.colorbar_y + (l.colorbar_height - 1) / 2;
  CHECK(near(img.at(l.colorbar_x + 5, bar_mid), rgb(plot::viridis(0.5)), 3));
  CHECK(img.at(l.colorbar_x - 1, l.colorbar_y + 50) == kBlack);

  // Text: the titles above the panels, tick labels beside and below panel 0, the colour bar's
  // numbers and label; and nothing between the panels' boxes away from the tick labels. The title
  // (scale 2: 18 px tall from the 16-px margin) centred, then the subtitle below it.
  CHECK(img.dark(0, 0, img.width / 2, 37) > 50);
  CHECK(img.dark(img.width / 2, 0, img.width, 37) > 50);
  CHECK(img.dark(0, 37, img.width, y0 - 30) > 200);
  CHECK(img.dark(x0, y0 - 30, x0 + 256, y0 - 2) > 40);          // "head 1"
  CHECK(img.dark(x0 - 40, y0, x0 - 2, y0 + 16) > 5);            // "0" at the top left
  CHECK(img.dark(x0 - 40, y0 + 240, x0 - 2, y0 + 256) > 5);     // "3" at the bottom left
  CHECK(img.dark(x0, y0 + 258, x0 + 30, y0 + 280) > 5);         // "0" below, left
  CHECK(img.dark(x0 + 226, y0 + 258, x0 + 256, y0 + 280) > 5);  // "3" below, right
  const int64_t bar_right = l.colorbar_x + l.colorbar_width + 1;
  CHECK(img.dark(bar_right, l.colorbar_y - 8, img.width, l.colorbar_y + 8) > 20);  // "15"
  CHECK(img.dark(bar_right, l.colorbar_y + l.colorbar_height - 8, img.width,
                 l.colorbar_y + l.colorbar_height + 8) > 5);  // "0"
  CHECK(img.dark(l.colorbar_x, l.colorbar_y - 32, img.width, l.colorbar_y - 9) >
        40);  // "correlation"
  CHECK(img.dark(x0 + 258, y0 + 20, x1 - 2, y0 + 236) == 0);
  CHECK(img.dark(x0 + 258, y0 - 40, x1 - 40, y0 + 300) == 0);
  CHECK(img.dark(0, y0 + 300, img.width, img.height) == 0);  // below the labels: blank margin
  // The outermost rows and columns are margin.
  CHECK(img.dark(0, 0, img.width, 4) + img.dark(0, img.height - 4, img.width, img.height) == 0);
  CHECK(img.dark(0, 0, 4, img.height) + img.dark(img.width - 4, 0, img.width, img.height) == 0);
}

TEST_CASE("write_heatmap_grid: an explicit range clamps, constant and all-NaN panels draw",
          "[plot]") {
  TempDir dir;
  plot::GridOptions o;
  o.panel_width = 30, o.panel_height = 10;
  o.has_range = true, o.range_min = 0, o.range_max = 1;
  plot::GridLayout l =
      plot::write_heatmap_grid(dir.file("a.png"), {panel("", 1, 3, {-5, 0.5f, 5})}, o);
  CHECK(l.range_min == 0);
  CHECK(l.range_max == 1);
  Image img = decode(dir.file("a.png"));
  int64_t x = l.panel_origin[0][0], y = l.panel_origin[0][1];
  CHECK(img.at(x + 5, y + 5) == rgb(plot::viridis(0)));
  CHECK(img.at(x + 15, y + 5) == rgb(plot::viridis(0.5)));
  CHECK(img.at(x + 25, y + 5) == rgb(plot::viridis(1)));
  // A short grid still gets a 200-px colour bar, inside the image.
  REQUIRE(l.colorbar_height == 200);
  CHECK(img.at(l.colorbar_x, l.colorbar_y) == rgb(plot::viridis(1)));
  CHECK(img.at(l.colorbar_x, l.colorbar_y + 199) == rgb(plot::viridis(0)));
  CHECK(img.at(l.colorbar_x, l.colorbar_y + 200) == kBlack);
  CHECK(img.height > l.colorbar_y + 210);

  // A constant matrix is the middle of min-0.5 .. min+0.5; infinities are grey and not in the
  // range.
  o.has_range = false;
  l = plot::write_heatmap_grid(dir.file("b.png"), {panel("c", 2, 2, {3, 3, kInf, 3})}, o);
  CHECK(l.range_min == 2.5);
  CHECK(l.range_max == 3.5);
  img = decode(dir.file("b.png"));
  x = l.panel_origin[0][0], y = l.panel_origin[0][1];
  CHECK(img.at(x, y) == rgb(plot::viridis(0.5)));
  CHECK(img.at(x + 29, y) == rgb(plot::viridis(0.5)));
  CHECK(img.at(x + 10, y + 9) == kGrey);

  // Nothing finite anywhere: range 0 .. 1, every cell grey.
  l = plot::write_heatmap_grid(dir.file("c.png"), {panel("nan", 2, 1, {kNaN, -kInf})}, o);
  CHECK(l.range_min == 0);
  CHECK(l.range_max == 1);
  img = decode(dir.file("c.png"));
  x = l.panel_origin[0][0], y = l.panel_origin[0][1];
  for (int64_t py = 0; py < 10; ++py)
    for (int64_t px = 0; px < 30; ++px) CHECK(img.at(x + px, y + py) == kGrey);
}

TEST_CASE("write_heatmap_grid: the [CLS] row and column on a scale of their own", "[plot]") {
  TempDir dir;
  plot::GridOptions o;
  o.panel_width = o.panel_height = 30;  // 3 x 3 cells of 10 px
  // [CLS] row and column at 100..900, the rest 0..1: one scale would make the rest one colour.
  const std::vector<float> v = {100, 500, 900, 300, 0, 0.5f, 700, 1, 0.25f};
  plot::GridLayout l = plot::write_heatmap_grid(dir.file("one.png"), {panel("", 3, 3, v)}, o);
  CHECK(l.range_max == 900);
  o.separate_first = 1;
  o.separate_label = "[CLS]";
  l = plot::write_heatmap_grid(dir.file("two.png"), {panel("", 3, 3, v)}, o);
  CHECK(l.range_min == 0);
  CHECK(l.range_max == 1);
  CHECK(l.range2_min == 100);
  CHECK(l.range2_max == 900);
  const Image img = decode(dir.file("two.png"));
  const int64_t x = l.panel_origin[0][0], y = l.panel_origin[0][1];
  auto cell = [&](int r, int c) { return img.at(x + 10 * c + 5, y + 10 * r + 5); };
  CHECK(cell(1, 1) == rgb(plot::viridis(0)));     // 0 on 0..1
  CHECK(cell(1, 2) == rgb(plot::viridis(0.5)));   // 0.5
  CHECK(cell(2, 1) == rgb(plot::viridis(1)));     // 1
  CHECK(cell(0, 0) == rgb(plot::viridis(0)));     // 100 on 100..900
  CHECK(cell(0, 1) == rgb(plot::viridis(0.5)));   // 500
  CHECK(cell(0, 2) == rgb(plot::viridis(1)));     // 900
  CHECK(cell(2, 0) == rgb(plot::viridis(0.75)));  // 700
  // The second colour bar, right of the first, spans the [CLS] range; its label is drawn.
  CHECK(l.colorbar2_x > l.colorbar_x + l.colorbar_width);
  CHECK(l.colorbar2_x + l.colorbar_width < l.width);
  CHECK(img.at(l.colorbar2_x, l.colorbar2_y) == rgb(plot::viridis(1)));
  CHECK(img.at(l.colorbar2_x, l.colorbar2_y + l.colorbar_height - 1) == rgb(plot::viridis(0)));
  CHECK(img.dark(l.colorbar2_x, l.colorbar2_y - 30, l.width, l.colorbar2_y - 2) > 0);
}

TEST_CASE("write_heatmap_grid: non-square panels map cells to pixel blocks, and downsample",
          "[plot]") {
  TempDir dir;
  // 3 x 255 in a 512 x 48 box: rows are 16 px; column c covers [floor(c*512/255),
  // floor((c+1)*512/255)).
  std::vector<float> v(3 * 255);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  plot::GridOptions o;
  o.panel_width = 512, o.panel_height = 48;
  const plot::GridLayout l =
      plot::write_heatmap_grid(dir.file("wide.png"), {panel("wide", 3, 255, v)}, o);
  const Image img = decode(dir.file("wide.png"));
  const int64_t x0 = l.panel_origin[0][0], y0 = l.panel_origin[0][1];
  int64_t checked = 0;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 255; ++c) {
      const Color want = rgb(plot::viridis((r * 255 + c) / 764.0));
      for (int64_t py = r * 16; py < (r + 1) * 16; ++py)
        for (int64_t px = c * 512 / 255; px < (c + 1) * 512 / 255; ++px, ++checked)
          if (img.at(x0 + px, y0 + py) != want)
            FAIL("cell (" << r << ", " << c << ") pixel " << px << ", " << py);
    }
  CHECK(checked == 512 * 48);

  // More columns than pixels: pixel px shows cell floor(px * cols / W).
  std::vector<float> w(600);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i);
  o.panel_width = 300, o.panel_height = 10;
  const plot::GridLayout l2 =
      plot::write_heatmap_grid(dir.file("down.png"), {panel("down", 1, 600, w)}, o);
  const Image img2 = decode(dir.file("down.png"));
  for (int64_t px = 0; px < 300; ++px)
    if (img2.at(l2.panel_origin[0][0] + px, l2.panel_origin[0][1] + 3) !=
        rgb(plot::viridis(2 * px / 599.0)))
      FAIL("downsampled pixel " << px);
}

TEST_CASE("write_heatmap_grid: bad panels, options and paths are clear errors", "[plot]") {
  TempDir dir;
  const std::string path = dir.file("x.png");
  const plot::GridOptions ok;
  const std::vector<plot::Panel> one{panel("p", 2, 2, {1, 2, 3, 4})};
  REQUIRE_THROWS_WITH(plot::write_heatmap_grid(path, {}, ok), Contains("[plot] no panels"));
  REQUIRE_THROWS_WITH(plot::layout_grid({}, ok), Contains("[plot] no panels"));

  const std::vector<plot::Panel> short_values{panel("head 1", 2, 3, std::vector<float>(6)),
                                              panel("head 2", 2, 3, std::vector<float>(5))};
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, short_values, ok); }),
             Contains("[plot] panel 1 (\"head 2\") has 5 values, expected rows*cols = 2*3 = 6"));
  CHECK_THAT(error_of([&] { plot::layout_grid(short_values, ok); }),
             Contains("panel 1 (\"head 2\")"));
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, {panel("z", 0, 3, {})}, ok); }),
             Contains("[plot] panel 0 (\"z\") has 0 rows and 3 cols; rows and cols must be >= 1"));
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, {panel("z", 2, -1, {})}, ok); }),
             Contains("rows and cols must be >= 1"));

  plot::GridOptions o = ok;
  o.panel_width = 0;
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, one, o); }),
             Contains("[plot] panel_width and panel_height must be >= 1"));
  o = ok, o.panel_height = -3;
  CHECK_THAT(error_of([&] { plot::layout_grid(one, o); }), Contains("got 256 x -3"));
  o = ok, o.columns = 0;
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, one, o); }),
             Contains("[plot] columns must be >= 1, got 0"));
  o = ok, o.has_range = true, o.range_min = 2, o.range_max = 1;
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, one, o); }),
             Contains("[plot] range_max (1) must be greater than range_min (2)"));
  o.range_max = 2;
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(path, one, o); }),
             Contains("[plot] range_max (2)"));
  CHECK_FALSE(std::filesystem::exists(path));

  const std::string unwritable = dir.file("missing/dir/x.png");
  CHECK_THAT(error_of([&] { plot::write_heatmap_grid(unwritable, one, ok); }),
             Contains("[plot] " + unwritable + ": cannot create the temporary file '" + unwritable +
                      ".tmp."));
}

// Not run by default: `plot_tests "[demo]"` writes a TUPE-style 12-head grid to $HEATMAP_DEMO
// (default /tmp/heatmap_demo.png) to look at.
TEST_CASE("demo: a 12-head grid of 128 x 128 matrices", "[.][demo]") {
  const char* env = std::getenv("HEATMAP_DEMO");
  const std::string path = env ? env : "/tmp/heatmap_demo.png";
  std::vector<plot::Panel> panels;
  for (int h = 0; h < 12; ++h) {
    plot::Panel p = panel("head " + std::to_string(h + 1), 128, 128, std::vector<float>(128 * 128));
    const double k = 1.0 + 3.0 * h;
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < 128; ++j) {
        const double d = std::abs(i - j);
        p.values[size_t(i * 128 + j)] = float(std::exp(-d / k) * std::cos(d / (2 * k)));
      }
    if (h == 11) p.values[0] = kNaN;
    panels.push_back(std::move(p));
  }
  plot::GridOptions o;
  o.title = "Learned positional correlations (layer 1)";
  o.subtitle = "rows: query position i, columns: key position j";
  o.colorbar_label = "corr";
  o.panel_width = o.panel_height = 128;
  const plot::GridLayout l = plot::write_heatmap_grid(path, panels, o);
  CHECK(decode(path).width == l.width);
}
