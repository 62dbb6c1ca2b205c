// examples/train_gpt/svg_chart.h: charts written as SVG text, enough for train_gpt's report: panels side by
// side, each a line chart (ChartPanel: axes, ticks, a legend and optional vertical markers) or a
// stacked bar chart (BarPanel: one bar per label, a color per category, a legend).
#pragma once

#include <string>
#include <variant>
#include <vector>

struct ChartSeries {
    std::string name;   // in the legend; "" for points: none
    std::string color;  // any SVG color
    std::vector<double> x, y;  // finite values
    bool dashed = false;
    bool points = false;              // a circle at each point instead of a line through them
    std::vector<std::string> labels = {};  // with points: text beside each point ("" or missing: none)
};

struct ChartMarker {
    double x;
    std::string label;
};

struct ChartPanel {
    std::string title, x_label, y_label;
    std::vector<ChartSeries> series;
    std::vector<ChartMarker> markers;  // vertical dashed lines
};

// One stacked bar: values[c] of category c, stacked bottom up in the categories' order.
struct ChartBar {
    std::string label;          // under the bar
    std::vector<double> values;  // finite, >= 0; one per category (missing ones count as 0)
};

struct BarPanel {
    std::string title, y_label;
    std::vector<std::string> categories, colors;  // a color per category (any SVG color)
    std::vector<ChartBar> bars;                   // left to right
};

using Panel = std::variant<ChartPanel, BarPanel>;

// One SVG document with the panels laid out left to right, each panel_width x panel_height px.
// Never throws except std::bad_alloc.
std::string render_svg(const std::vector<Panel>& panels, int panel_width = 560, int panel_height = 380);
