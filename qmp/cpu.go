package qmp

import (
	"context"
	"errors"
)

// CPUFeatureOn reads a boolean feature property of the vCPU at qomPath (qom-get): whether the
// guest sees the feature.
func (m *Monitor) CPUFeatureOn(ctx context.Context, qomPath, feature string) (bool, error) {
	var on bool
	err := m.Call(ctx, "qom-get", map[string]string{"path": qomPath, "property": feature}, &on)
	return on, err
}

// ModelFeatures are the features of CPU model name as the accelerator would run it
// (query-cpu-model-expansion, type full): for "max", what this host can give a guest at all.
func (m *Monitor) ModelFeatures(ctx context.Context, name string) (map[string]any, error) {
	var out struct {
		Model struct {
			Props map[string]any `json:"props"`
		} `json:"model"`
	}
	args := map[string]any{"type": "full", "model": map[string]string{"name": name}}
	if err := m.Call(ctx, "query-cpu-model-expansion", args, &out); err != nil {
		return nil, err
	}
	if out.Model.Props == nil {
		return nil, errors.New("query-cpu-model-expansion returned no properties")
	}
	return out.Model.Props, nil
}
