package testutil

import (
	"math"
	"testing"
)

func TestHistQuantileAndSince(t *testing.T) {
	before := Hist{Sum: 1, Count: 2, Buckets: map[float64]float64{0.1: 2, 1: 2, math.Inf(1): 2}}
	after := Hist{Sum: 6, Count: 12, Buckets: map[float64]float64{0.1: 4, 1: 12, math.Inf(1): 12}}
	d := after.Since(before)
	if d.Count != 10 || d.Sum != 5 || d.Mean() != 0.5 {
		t.Fatalf("since = %+v (mean %v), want 10 observations summing to 5", d, d.Mean())
	}
	// 2 of 10 at most 0.1, the other 8 in (0.1, 1]: the median is 3/8 into that bucket.
	if q := d.Quantile(0.5); math.Abs(q-(0.1+0.9*3/8)) > 1e-9 {
		t.Errorf("P50 = %v, want 0.4375", q)
	}
	if q := d.Quantile(0.1); math.Abs(q-0.05) > 1e-9 {
		t.Errorf("P10 = %v, want 0.05", q)
	}
	beyond := Hist{Count: 1, Sum: 9, Buckets: map[float64]float64{1: 0, math.Inf(1): 1}}
	if q := beyond.Quantile(0.95); q != 1 {
		t.Errorf("P95 beyond the last bound = %v, want that bound (1)", q)
	}
	sum := d.Add(before)
	if sum.Count != 12 || sum.Sum != 6 || sum.Buckets[1] != 12 || sum.Buckets[0.1] != 4 {
		t.Errorf("add = %+v, want the after histogram back", sum)
	}
	if q := (Hist{}).Quantile(0.5); q != 0 {
		t.Errorf("P50 of nothing = %v, want 0", q)
	}
}
