// Heatmap grids as PNG files: a titled grid of per-head T x T matrices (e.g. the learned positional
// correlations of TUPE's Figure 5) in matplotlib's viridis, with tick labels and one colour bar
// shared by every panel. libpng encodes; stb_easy_font draws the text.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace plot {

struct Rgb {
  uint8_t r, g, b;
};

// Matplotlib's viridis colour map at t in [0, 1] (clamped; NaN gives t = 0): dark purple (68,1,84)
// at 0 to yellow (253,231,37) at 1, each channel within 3 of matplotlib's 256-entry table.
Rgb viridis(double t);

struct Panel {
  std::string title;  // drawn above the panel, e.g. "head 3"
  int64_t rows = 0, cols = 0;
  std::vector<float> values;  // row-major rows*cols; NaN/inf cells drawn grey (128,128,128)
  double row_start = 0, col_start = 0;  // axis labels: row r is labelled row_start + r (ditto cols)
};

struct GridOptions {
  std::string title;           // first line at the top (scale 2)
  std::string subtitle;        // second line, may be empty
  std::string colorbar_label;  // text above the colour bar, may be empty
  int64_t columns = 4;         // panels per grid row (fewer if there are fewer panels)
  int64_t panel_width = 256, panel_height = 256;  // pixel box of each panel's image
  // Else min/max over every finite value of every panel (max == min: min-0.5 .. min+0.5; none: 0 ..
  // 1).
  bool has_range = false;
  double range_min = 0, range_max = 0;
  // > 0: the first `separate_first` rows and columns of every panel (TUPE's [CLS] row and column,
  // whose values can dwarf the rest) get a colour range of their own — min/max over those cells
  // of every panel, shown on a second colour bar titled `separate_label` — and the range above
  // (computed or given) covers the other cells only.
  int64_t separate_first = 0;
  std::string separate_label = "[CLS]";
};

// Where everything is, so tests (and callers) can find a panel's pixels.
struct GridLayout {
  int64_t width = 0, height = 0;  // whole image
  std::vector<std::array<int64_t, 2>>
      panel_origin;  // top-left pixel (x, y) of each panel's image box
  // The gradient strip: top row = max colour, bottom row = min colour.
  int64_t colorbar_x = 0, colorbar_y = 0, colorbar_width = 0, colorbar_height = 0;
  double range_min = 0, range_max = 0;  // the colour range used
  // With separate_first: the second bar (same height, right of the first) and its range.
  int64_t colorbar2_x = 0, colorbar2_y = 0;
  double range2_min = 0, range2_max = 0;
};

// The layout write_heatmap_grid would use; validates the same way (engine::Error "[plot] ...").
GridLayout layout_grid(const std::vector<Panel>& panels, const GridOptions& options);

// Renders the grid and writes it atomically as an 8-bit RGB PNG. Returns the layout used.
GridLayout write_heatmap_grid(const std::string& path, const std::vector<Panel>& panels,
                              const GridOptions& options);

}  // namespace plot
