// examples/svg_chart.h: line charts written as SVG text, enough for train_gpt's report
// (panels side by side, each with axes, ticks, a legend and optional vertical markers).
#pragma once

#include <string>
#include <vector>

struct ChartSeries {
    std::string name;
    std::string color;  // any SVG color
    std::vector<double> x, y;  // finite values
    bool dashed = false;
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

// One SVG document with the panels laid out left to right, each panel_width x panel_height px.
std::string render_svg(const std::vector<ChartPanel>& panels, int panel_width = 560, int panel_height = 380);
