// examples/train_gpt/svg_chart.cpp: the SVG writer behind train_gpt's chart: line, scatter and stacked bar panels.
#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace {

// About five round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
    double span = hi - lo;
    if (!(span > 0)) return {lo};
    double step = std::pow(10.0, std::floor(std::log10(span / 5)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (span / (step * m) <= 6) {
            step *= m;
            break;
        }
    std::vector<double> out;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
    return out;
}

std::string fmt(double v) {
    std::ostringstream ss;
    ss.precision(4);
    ss << v;
    return ss.str();
}

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '&') out += "&amp;";
        else out += c;
    }
    return out;
}

void render_panel(std::ostringstream& svg, const ChartPanel& p, double ox, int w, int h) {
    const double left = 70, right = 20, top = 40, bottom = 50;
    double x0 = ox + left, x1 = ox + w - right, y0 = top, y1 = h - bottom;
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
    for (const ChartSeries& s : p.series)
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            xmin = std::min(xmin, s.x[i]);
            xmax = std::max(xmax, s.x[i]);
            ymin = std::min(ymin, s.y[i]);
            ymax = std::max(ymax, s.y[i]);
        }
    for (const ChartMarker& m : p.markers) {
        xmin = std::min(xmin, m.x);
        xmax = std::max(xmax, m.x);
    }
    if (!std::isfinite(xmin)) xmin = xmax = 0;  // nothing to draw: an empty frame
    if (!std::isfinite(ymin)) ymin = ymax = 0;
    if (!(xmax > xmin)) xmax = xmin + 1;
    if (!(ymax > ymin)) ymax = ymin + 1;
    double pad = (ymax - ymin) * 0.05;
    ymin -= pad;
    ymax += pad;
    auto px = [&](double x) { return x0 + (x - xmin) / (xmax - xmin) * (x1 - x0); };
    auto py = [&](double y) { return y1 - (y - ymin) / (ymax - ymin) * (y1 - y0); };

    svg << "<text x='" << (x0 + x1) / 2 << "' y='22' text-anchor='middle' font-size='15' font-weight='bold'>"
        << escape(p.title) << "</text>\n";
    svg << "<rect x='" << x0 << "' y='" << y0 << "' width='" << x1 - x0 << "' height='" << y1 - y0
        << "' fill='none' stroke='#444'/>\n";
    for (double t : ticks(xmin, xmax)) {
        svg << "<line x1='" << px(t) << "' y1='" << y1 << "' x2='" << px(t) << "' y2='" << y1 + 5 << "' stroke='#444'/>";
        svg << "<text x='" << px(t) << "' y='" << y1 + 18 << "' text-anchor='middle' font-size='11'>" << fmt(t) << "</text>\n";
    }
    for (double t : ticks(ymin, ymax)) {
        svg << "<line x1='" << x0 << "' y1='" << py(t) << "' x2='" << x1 << "' y2='" << py(t) << "' stroke='#ddd'/>";
        svg << "<text x='" << x0 - 6 << "' y='" << py(t) + 4 << "' text-anchor='end' font-size='11'>" << fmt(t) << "</text>\n";
    }
    svg << "<text x='" << (x0 + x1) / 2 << "' y='" << h - 12 << "' text-anchor='middle' font-size='12'>"
        << escape(p.x_label) << "</text>\n";
    svg << "<text transform='translate(" << ox + 16 << "," << (y0 + y1) / 2
        << ") rotate(-90)' text-anchor='middle' font-size='12'>" << escape(p.y_label) << "</text>\n";
    for (const ChartMarker& m : p.markers) {
        svg << "<line x1='" << px(m.x) << "' y1='" << y0 << "' x2='" << px(m.x) << "' y2='" << y1
            << "' stroke='#888' stroke-dasharray='4,4'/>";
        svg << "<text x='" << px(m.x) + 4 << "' y='" << y0 + 14 << "' font-size='11' fill='#555'>" << escape(m.label)
            << "</text>\n";
    }
    double ly = y0 + 14;
    for (const ChartSeries& s : p.series) {
        if (s.points) {
            for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
                svg << "<circle cx='" << px(s.x[i]) << "' cy='" << py(s.y[i]) << "' r='3.5' fill='" << s.color << "'/>";
                if (i < s.labels.size() && !s.labels[i].empty())
                    svg << "<text x='" << px(s.x[i]) + 6 << "' y='" << py(s.y[i]) - 4 << "' font-size='9' fill='"
                        << s.color << "'>" << escape(s.labels[i]) << "</text>";
                svg << "\n";
            }
            if (s.name.empty()) continue;  // drawn, but not in the legend
            svg << "<circle cx='" << x1 - 139 << "' cy='" << ly << "' r='3.5' fill='" << s.color << "'/>";
        } else {
            svg << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.6'"
                << (s.dashed ? " stroke-dasharray='6,3'" : "") << " points='";
            for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) svg << px(s.x[i]) << "," << py(s.y[i]) << " ";
            svg << "'/>\n";
            svg << "<line x1='" << x1 - 150 << "' y1='" << ly << "' x2='" << x1 - 128 << "' y2='" << ly << "' stroke='"
                << s.color << "' stroke-width='2'" << (s.dashed ? " stroke-dasharray='6,3'" : "") << "/>";
        }
        svg << "<text x='" << x1 - 122 << "' y='" << ly + 4 << "' font-size='11'>" << escape(s.name) << "</text>\n";
        ly += 16;
    }
}

// The panel's frame, title and y axis from 0 to the tallest bar; each bar in the middle of its slot,
// 40% of it wide (at most 60 px); the legend at the top right, from the last category down, as the
// stack reads.
void render_bars(std::ostringstream& svg, const BarPanel& p, double ox, int w, int h) {
    const double left = 70, right = 20, top = 40, bottom = 50;
    double x0 = ox + left, x1 = ox + w - right, y0 = top, y1 = h - bottom;
    double ymax = 0;
    for (const ChartBar& b : p.bars) {
        double sum = 0;
        for (double v : b.values) sum += std::isfinite(v) && v > 0 ? v : 0;
        ymax = std::max(ymax, sum);
    }
    if (!(ymax > 0)) ymax = 1;
    ymax *= 1.05;
    auto py = [&](double y) { return y1 - y / ymax * (y1 - y0); };

    svg << "<text x='" << (x0 + x1) / 2 << "' y='22' text-anchor='middle' font-size='15' font-weight='bold'>"
        << escape(p.title) << "</text>\n";
    svg << "<rect x='" << x0 << "' y='" << y0 << "' width='" << x1 - x0 << "' height='" << y1 - y0
        << "' fill='none' stroke='#444'/>\n";
    for (double t : ticks(0, ymax)) {
        svg << "<line x1='" << x0 << "' y1='" << py(t) << "' x2='" << x1 << "' y2='" << py(t) << "' stroke='#ddd'/>";
        svg << "<text x='" << x0 - 6 << "' y='" << py(t) + 4 << "' text-anchor='end' font-size='11'>" << fmt(t) << "</text>\n";
    }
    svg << "<text transform='translate(" << ox + 16 << "," << (y0 + y1) / 2
        << ") rotate(-90)' text-anchor='middle' font-size='12'>" << escape(p.y_label) << "</text>\n";
    // The bars take the left 60% of the frame; the legend the rest.
    const double slot = (x1 - x0) * 0.6 / static_cast<double>(std::max<size_t>(p.bars.size(), 1));
    for (size_t i = 0; i < p.bars.size(); ++i) {
        const ChartBar& b = p.bars[i];
        const double bw = std::min(slot * 0.4, 60.0), bx = x0 + slot * (static_cast<double>(i) + 0.5) - bw / 2;
        double base = 0;
        for (size_t c = 0; c < b.values.size() && c < p.categories.size(); ++c) {
            const double v = std::isfinite(b.values[c]) && b.values[c] > 0 ? b.values[c] : 0;
            if (v == 0) continue;
            svg << "<rect x='" << bx << "' y='" << py(base + v) << "' width='" << bw << "' height='"
                << py(base) - py(base + v) << "' fill='" << (c < p.colors.size() ? p.colors[c] : "#888")
                << "'><title>" << escape(b.label + ": " + p.categories[c] + " " + fmt(v)) << "</title></rect>\n";
            base += v;
        }
        svg << "<text x='" << bx + bw / 2 << "' y='" << y1 + 18 << "' text-anchor='middle' font-size='11'>"
            << escape(b.label) << "</text>\n";
    }
    double ly = y0 + 14;
    for (size_t c = p.categories.size(); c-- > 0;) {
        svg << "<rect x='" << x1 - 170 << "' y='" << ly - 8 << "' width='12' height='12' fill='"
            << (c < p.colors.size() ? p.colors[c] : "#888") << "'/>";
        svg << "<text x='" << x1 - 152 << "' y='" << ly + 2 << "' font-size='11'>" << escape(p.categories[c])
            << "</text>\n";
        ly += 16;
    }
}

}  // namespace

std::string render_svg(const std::vector<Panel>& panels, int w, int h) {
    std::ostringstream svg;
    svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w * panels.size() << "' height='" << h
        << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
    for (size_t i = 0; i < panels.size(); ++i) {
        const double ox = static_cast<double>(i * w);
        if (const ChartPanel* lines = std::get_if<ChartPanel>(&panels[i])) render_panel(svg, *lines, ox, w, h);
        else render_bars(svg, std::get<BarPanel>(panels[i]), ox, w, h);
    }
    svg << "</svg>\n";
    return svg.str();
}
