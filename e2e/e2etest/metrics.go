package e2etest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Scrape GETs url (a sidecar's metrics listener) and returns the status
// code and body. It keeps no connection alive: an idle one would count as
// a leak in the sidecar's idle figures, or outlive the test.
func Scrape(url string) (int, string, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("scrape %s: read body: %w", url, err)
	}
	return resp.StatusCode, string(b), nil
}

// MetricValue finds one sample ("name{labels} value") in a Prometheus text
// exposition; series is the name with its labels exactly as exposed.
func MetricValue(body, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
