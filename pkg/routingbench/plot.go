package routingbench

import (
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette colours the series of a panel.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// series is one bar per policy of a panel.
type series struct {
	name  string
	value func(*PolicyResult) float64
}

// WritePNG draws the report as a PNG of three panels with one column per
// policy: bars of the token prefix-hit ratio under a line at the pooled
// bound's, the time to first token at p50, p90 and p99 and the end-to-end
// latency at p90 as marks on a log scale (policies differ by orders of
// magnitude), and bars of the load imbalance (coefficients of variation of
// requests and prefill tokens across engines, and the largest deviation of
// an engine's requests from the mean of the engines of its speed).
func (r *Report) WritePNG(w io.Writer) error {
	names := make([]string, len(r.Results))
	for i, res := range r.Results {
		names[i] = res.Policy
	}
	panels := []struct {
		title, y string
		series   []series
		draw     func(title, yLabel string, names []string, results []*PolicyResult, ss []series) (*plot.Plot, error)
	}{
		{"Token prefix-hit ratio", "cached / prompt tokens", []series{
			{"hit ratio", func(p *PolicyResult) float64 { return p.HitRatio }},
		}, barPanel},
		{"Time to first token and end to end", "seconds (log scale)", []series{
			{"p50", func(p *PolicyResult) float64 { return p.TTFT.P50 }},
			{"p90", func(p *PolicyResult) float64 { return p.TTFT.P90 }},
			{"p99", func(p *PolicyResult) float64 { return p.TTFT.P99 }},
			{"E2E p90", func(p *PolicyResult) float64 { return p.E2E.P90 }},
		}, logDotPanel},
		{"Load imbalance across engines", "coefficient of variation; largest deviation", []series{
			{"requests (CV)", func(p *PolicyResult) float64 { return p.RequestsCV }},
			{"prefill tokens (CV)", func(p *PolicyResult) float64 { return p.PrefillCV }},
			{"requests vs same-speed peers", func(p *PolicyResult) float64 { return p.RequestsSpread }},
		}, barPanel},
	}
	row := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := pn.draw(pn.title, pn.y, names, r.Results, pn.series)
		if err != nil {
			return fmt.Errorf("plot %s: %w", pn.title, err)
		}
		row[i] = p
	}
	row[0].Title.Text = fmt.Sprintf("%s (%d engines)\n%s", r.Workload, r.Setup.Engines, row[0].Title.Text)
	if r.Bound != nil && r.Bound.HitRatio > 0 {
		if err := addBoundLine(row[0], r.Bound.HitRatio, len(names)); err != nil {
			return err
		}
	}

	img := vgimg.New(vg.Length(len(panels))*5*vg.Inch, 4*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("write png: %w", err)
	}
	return nil
}

// barPanel draws each series as a bar per policy, the series of a policy
// side by side. A panel of one series prints each bar's value above it.
func barPanel(title, yLabel string, names []string, results []*PolicyResult, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.35
	p.X.Tick.Label.XAlign = draw.XRight
	p.Add(plotter.NewGrid())
	width := vg.Points(36 / float64(len(ss)))
	top := 0.0
	for i, s := range ss {
		vals := make(plotter.Values, len(results))
		for j, res := range results {
			vals[j] = s.value(res)
			top = max(top, vals[j])
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(ss)-1)/2)
		p.Add(bars)
		if len(ss) > 1 {
			p.Legend.Add(s.name, bars)
			continue
		}
		labels, err := valueLabels(vals)
		if err != nil {
			return nil, err
		}
		p.Add(labels)
	}
	p.Legend.Top = true
	if top > 0 {
		// Headroom for the legend or the values above the bars.
		p.Y.Max = 1.3 * top
	}
	return p, nil
}

// addBoundLine draws the pooled bound's hit ratio across a bar panel of n
// columns, dashed, and names it in the legend.
func addBoundLine(p *plot.Plot, bound float64, n int) error {
	line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: bound}, {X: float64(n) - 0.5, Y: bound}})
	if err != nil {
		return err
	}
	line.Color = palette[3]
	line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(line)
	p.Legend.Add(fmt.Sprintf("pooled bound %.3f", bound), line)
	p.Y.Max = max(p.Y.Max, 1.3*bound)
	return nil
}

// valueLabels prints each value above its bar.
func valueLabels(vals plotter.Values) (*plotter.Labels, error) {
	xys := make(plotter.XYs, len(vals))
	texts := make([]string, len(vals))
	for i, v := range vals {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		texts[i] = fmt.Sprintf("%.3f", v)
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].XAlign = draw.XCenter
		labels.Offset.Y = vg.Points(3)
	}
	return labels, nil
}

// glyphs shape the marks of a dot panel's series.
var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.PyramidGlyph{}, draw.BoxGlyph{}, draw.CrossGlyph{}}

// logDotPanel marks each series' value per policy on a log scale, the
// marks of a policy side by side. Values of 0 (a policy without results)
// are left out, which a log scale cannot show.
func logDotPanel(title, yLabel string, names []string, results []*PolicyResult, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.X.Tick.Label.Rotation = 0.35
	p.X.Tick.Label.XAlign = draw.XRight
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for i, s := range ss {
		var xys plotter.XYs
		for j, res := range results {
			if v := s.value(res); v > 0 {
				xys = append(xys, plotter.XY{X: float64(j) + 0.15*(float64(i)-float64(len(ss)-1)/2), Y: v})
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		if len(xys) == 0 {
			continue
		}
		marks, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		marks.GlyphStyle = draw.GlyphStyle{Color: palette[i%len(palette)], Radius: vg.Points(4), Shape: glyphs[i%len(glyphs)]}
		p.Add(marks)
		p.Legend.Add(s.name, marks)
	}
	if hi > 0 {
		// Whole decades, so that ticks fall on the axis, and one more above
		// the marks for the legend.
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo/1.5)))
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi))+1)
	}
	p.Legend.Top = true
	return p, nil
}
