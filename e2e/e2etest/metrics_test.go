package e2etest

import "testing"

func TestMetricValue(t *testing.T) {
	body := "# HELP x\nstage_a 3\nstage_b{reason=\"per_addr\"} 2.5\nstage_b{reason=\"total\"} 7\nstage_c NaNx\n"
	for _, tc := range []struct {
		series string
		want   float64
		ok     bool
	}{
		{"stage_a", 3, true},
		{`stage_b{reason="per_addr"}`, 2.5, true},
		{`stage_b{reason="total"}`, 7, true},
		{"stage_b", 0, false}, // labels are part of the series
		{"stage_c", 0, false}, // not a number
		{"stage_d", 0, false},
	} {
		v, ok := MetricValue(body, tc.series)
		if v != tc.want || ok != tc.ok {
			t.Errorf("MetricValue(%s) = %v, %v; want %v, %v", tc.series, v, ok, tc.want, tc.ok)
		}
	}
}
