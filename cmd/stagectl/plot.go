package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/stage-kv/stage/config"
)

// Plot size: 900 x 540 pixels in a PNG (gonum's raster DPI is 96).
const (
	plotWidth  = 900 * vg.Inch / 96
	plotHeight = 540 * vg.Inch / 96
)

// plotFormats are the extensions gonum/plot writes; any other name gets a
// PNG, as --plot always wrote.
var plotFormats = map[string]bool{"png": true, "svg": true, "pdf": true, "eps": true, "jpg": true, "jpeg": true, "tif": true, "tiff": true}

// plotSweep draws throughput against block size (log scale, a tick at
// each measured size) with the raw TCP ceiling as a dashed line, into
// path: PNG, or SVG, PDF, EPS, JPEG or TIFF by its extension.
func plotSweep(path string, rs []*BenchResult, raw *RawResult, title string) error {
	if len(rs) == 0 {
		return fmt.Errorf("no results to plot")
	}
	p := sweepPlot(rs, raw, title)
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	if !plotFormats[format] {
		format = "png"
	}
	w, err := p.WriterTo(plotWidth, plotHeight, format)
	if err != nil {
		return fmt.Errorf("draw the plot as %s: %w", format, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write the plot: %w", err)
	}
	return f.Close()
}

// sweepPlot lays the plot out; plotSweep writes it.
func sweepPlot(rs []*BenchResult, raw *RawResult, title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "block size (log scale)"
	p.Y.Label.Text = "GB/s"
	p.X.Scale = plot.LogScale{}
	blue := color.RGBA{31, 119, 180, 255}
	red := color.RGBA{214, 39, 40, 255}

	pts := make(plotter.XYs, len(rs))
	ticks := make([]plot.Tick, len(rs))
	ymax := 0.0
	for i, r := range rs {
		pts[i] = plotter.XY{X: float64(r.Block), Y: r.GBps}
		ticks[i] = plot.Tick{Value: float64(r.Block), Label: config.ByteSize(r.Block).String()}
		ymax = max(ymax, r.GBps)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Add(plotter.NewGrid())
	line, points, err := plotter.NewLinePoints(pts)
	if err == nil { // only a NaN or an infinity fails, and a rate is neither
		line.Color, line.Width = blue, vg.Points(2)
		points.Color, points.Shape, points.Radius = blue, draw.BoxGlyph{}, vg.Points(3)
		p.Add(line, points)
		p.Legend.Add("stage push ("+rs[0].Devices+")", line, points)
	}
	if raw != nil {
		ymax = max(ymax, raw.GBps)
		lo, hi := pts[0].X, pts[len(pts)-1].X
		ceiling, err := plotter.NewLine(plotter.XYs{{X: lo, Y: raw.GBps}, {X: hi, Y: raw.GBps}})
		if err == nil {
			ceiling.Color, ceiling.Dashes = red, []vg.Length{vg.Points(6), vg.Points(4)}
			p.Add(ceiling)
			p.Legend.Add(fmt.Sprintf("raw TCP, %d streams: %.2f GB/s", raw.Streams, raw.GBps), ceiling)
		}
	}
	p.Y.Min, p.Y.Max = 0, niceCeil(ymax*1.1)
	// Five labelled steps up the rate axis, as many as the grid draws.
	yt := make([]plot.Tick, 6)
	for i := range yt {
		v := p.Y.Max * float64(i) / 5
		yt[i] = plot.Tick{Value: v, Label: fmt.Sprintf("%.1f", v)}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(yt)
	// The curve rises to the right: the lower right corner is free.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(24), vg.Points(8)
	return p
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten, so that
// the rate axis's five steps are round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
