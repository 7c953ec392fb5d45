package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/stage-kv/stage/config"
)

// plotSweep draws throughput against block size (log scale) with the raw
// TCP ceiling as a dashed line, into a PNG. It draws with the standard
// image packages and a bitmap font: no plotting library, nothing to load.
func plotSweep(path string, rs []*BenchResult, raw *RawResult, title string) error {
	const W, H = 900, 540
	const left, right, top, bottom = 80, 30, 50, 70
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	grey := color.RGBA{220, 220, 220, 255}
	dark := color.RGBA{40, 40, 40, 255}
	blue := color.RGBA{31, 119, 180, 255}
	red := color.RGBA{214, 39, 40, 255}

	ymax := 0.0
	for _, r := range rs {
		ymax = math.Max(ymax, r.GBps)
	}
	if raw != nil {
		ymax = math.Max(ymax, raw.GBps)
	}
	ymax = niceCeil(ymax * 1.1)
	xmin, xmax := math.Log2(float64(rs[0].Block)), math.Log2(float64(rs[len(rs)-1].Block))
	if xmax == xmin {
		xmax = xmin + 1
	}
	px := func(block uint64) int {
		return left + int(float64(W-left-right)*(math.Log2(float64(block))-xmin)/(xmax-xmin))
	}
	py := func(v float64) int { return H - bottom - int(float64(H-top-bottom)*v/ymax) }

	// grid and axes
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		y := py(v)
		line(img, left, y, W-right, y, grey, false)
		text(img, 8, y+4, fmt.Sprintf("%6.1f", v), dark)
	}
	for _, r := range rs {
		x := px(r.Block)
		line(img, x, top, x, H-bottom, grey, false)
		label := config.ByteSize(r.Block).String()
		text(img, x-len(label)*7/2, H-bottom+18, label, dark)
	}
	line(img, left, H-bottom, W-right, H-bottom, dark, false)
	line(img, left, top, left, H-bottom, dark, false)
	text(img, left, 30, title, dark)
	text(img, W/2-60, H-20, "block size (log scale)", dark)
	text(img, 8, top-12, "GB/s", dark)

	// raw TCP ceiling
	if raw != nil {
		y := py(raw.GBps)
		line(img, left, y, W-right, y, red, true)
		text(img, W-right-300, y-8, fmt.Sprintf("raw TCP, %d streams: %.2f GB/s", raw.Streams, raw.GBps), red)
	}
	// stage
	for i, r := range rs {
		x, y := px(r.Block), py(r.GBps)
		if i > 0 {
			line(img, px(rs[i-1].Block), py(rs[i-1].GBps), x, y, blue, false)
			line(img, px(rs[i-1].Block), py(rs[i-1].GBps)+1, x, y+1, blue, false)
		}
		for dx := -3; dx <= 3; dx++ {
			for dy := -3; dy <= 3; dy++ {
				img.Set(x+dx, y+dy, blue)
			}
		}
	}
	text(img, left+10, top+14, "stage push ("+rs[0].Devices+")", blue)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

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

// line draws a 1-pixel line (Bresenham), dashed when asked.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color, dashed bool) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for n := 0; ; n++ {
		if !dashed || (n/6)%2 == 0 {
			img.Set(x0, y0, c)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		if 2*e >= dy {
			e += dy
			x0 += sx
		}
		if 2*e <= dx {
			e += dx
			y0 += sy
		}
	}
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}
