package qmp

import (
	"context"
	"encoding/json"
	"fmt"
)

// CommandInfo is one entry of query-commands.
type CommandInfo struct {
	Name string `json:"name"`
}

// QueryCommands lists the commands this QEMU accepts.
func (m *Monitor) QueryCommands(ctx context.Context) ([]CommandInfo, error) {
	var cmds []CommandInfo
	err := m.Call(ctx, "query-commands", nil, &cmds)
	return cmds, err
}

// HasCommand reports whether QEMU accepts the command called name. The list
// is fetched with query-commands on first use and cached for the monitor's
// life: a QEMU process does not gain or lose commands.
func (m *Monitor) HasCommand(ctx context.Context, name string) (bool, error) {
	if known, cached := m.cachedCommands(); cached {
		return known[name], nil
	}
	cmds, err := m.QueryCommands(ctx)
	if err != nil {
		return false, err
	}
	known := make(map[string]bool, len(cmds))
	for _, c := range cmds {
		known[c.Name] = true
	}
	m.mu.Lock()
	m.commands = known
	m.mu.Unlock()
	return known[name], nil
}

func (m *Monitor) cachedCommands() (map[string]bool, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commands, m.commands != nil
}

// SchemaInfo is one entity of query-qmp-schema. Type names other than the
// built-ins are opaque numbers that are only valid within one reply.
type SchemaInfo struct {
	Name     string   `json:"name"`
	MetaType string   `json:"meta-type"` // builtin, enum, array, object, alternate, command, event
	Features []string `json:"features,omitempty"`

	ArgType     string   `json:"arg-type,omitempty"` // command, event
	RetType     string   `json:"ret-type,omitempty"` // command
	AllowOOB    bool     `json:"allow-oob,omitempty"`
	JSONType    string   `json:"json-type,omitempty"`    // builtin
	Values      []string `json:"values,omitempty"`       // enum
	ElementType string   `json:"element-type,omitempty"` // array

	Members  []SchemaMember  `json:"members,omitempty"` // object, alternate, enum
	Tag      string          `json:"tag,omitempty"`     // object with variants
	Variants []SchemaVariant `json:"variants,omitempty"`
}

// SchemaMember is a member of an object (Name, Type, Optional) or of an
// alternate (Type only).
type SchemaMember struct {
	Name     string   `json:"name,omitempty"`
	Type     string   `json:"type,omitempty"`
	Features []string `json:"features,omitempty"`
	// Optional is true when the schema gives a "default" key, which is how
	// QEMU marks optional members (its value is always null).
	Optional bool `json:"-"`
}

// UnmarshalJSON records whether "default" is present; its null value would
// be indistinguishable from absence in a plain field.
func (m *SchemaMember) UnmarshalJSON(b []byte) error {
	type plain SchemaMember // drops this method, avoiding recursion
	var v struct {
		plain
		Default json.RawMessage `json:"default"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*m = SchemaMember(v.plain)
	m.Optional = v.Default != nil
	return nil
}

// SchemaVariant maps a value of the tag member to the object type that
// adds its members.
type SchemaVariant struct {
	Case string `json:"case"`
	Type string `json:"type"`
}

// Schema is the reply of query-qmp-schema with a name index.
type Schema struct {
	Entities []SchemaInfo
	byName   map[string]int
}

// QueryQMPSchema fetches QEMU's introspection schema (about 200 KiB on 7.2).
// Use it to probe for arguments that changed between QEMU versions.
func (m *Monitor) QueryQMPSchema(ctx context.Context) (*Schema, error) {
	raw, err := m.Execute(ctx, "query-qmp-schema", nil)
	if err != nil {
		return nil, err
	}
	return parseSchema(raw)
}

func parseSchema(raw []byte) (*Schema, error) {
	s := &Schema{}
	if err := json.Unmarshal(raw, &s.Entities); err != nil {
		return nil, fmt.Errorf("qmp query-qmp-schema: decode reply: %w", err)
	}
	s.byName = make(map[string]int, len(s.Entities))
	for i, e := range s.Entities {
		s.byName[e.Name] = i
	}
	return s, nil
}

// Lookup finds an entity (command, event or type) by name.
func (s *Schema) Lookup(name string) (SchemaInfo, bool) {
	i, ok := s.byName[name]
	if !ok {
		return SchemaInfo{}, false
	}
	return s.Entities[i], true
}

// CommandArgs returns the arguments command accepts: the members of its
// argument object and, when tag names a variant (netdev_add's "tap",
// blockdev-add's "qcow2"), that variant's members too. ok is false when the
// command or the variant does not exist.
func (s *Schema) CommandArgs(command, tag string) (members []SchemaMember, ok bool) {
	cmd, ok := s.Lookup(command)
	if !ok || cmd.MetaType != "command" {
		return nil, false
	}
	args, ok := s.Lookup(cmd.ArgType)
	if !ok {
		return nil, false
	}
	members = append(members, args.Members...)
	if tag == "" {
		return members, true
	}
	for _, v := range args.Variants {
		if v.Case != tag {
			continue
		}
		variant, ok := s.Lookup(v.Type)
		if !ok {
			return nil, false
		}
		return append(members, variant.Members...), true
	}
	return nil, false
}
