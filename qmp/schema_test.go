package qmp_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/qmp"
)

// jsonNames lists the JSON member names of struct v's fields.
func jsonNames(v any) []string {
	var names []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		tag := typ.Field(i).Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

func memberSet(members []qmp.SchemaMember) map[string]bool {
	set := make(map[string]bool, len(members))
	for _, m := range members {
		set[m.Name] = true
	}
	return set
}

// objectMembers returns the members of the object type called typ.
func objectMembers(t *testing.T, s *qmp.Schema, typ string) map[string]bool {
	t.Helper()
	info, ok := s.Lookup(typ)
	if !ok || info.MetaType != "object" {
		t.Fatalf("schema type %q is %+v, want an object", typ, info)
	}
	return memberSet(info.Members)
}

// memberType finds the type name of member name of object typ.
func memberType(t *testing.T, s *qmp.Schema, typ, name string) string {
	t.Helper()
	info, _ := s.Lookup(typ)
	for _, m := range info.Members {
		if m.Name == name {
			return m.Type
		}
	}
	t.Fatalf("schema type %q has no member %q", typ, name)
	return ""
}

func enumValues(t *testing.T, s *qmp.Schema, typ string) []string {
	t.Helper()
	info, ok := s.Lookup(typ)
	if !ok || info.MetaType != "enum" {
		t.Fatalf("schema type %q is %+v, want an enum", typ, info)
	}
	return info.Values
}

func assertSubset(t *testing.T, what string, names []string, allowed map[string]bool) {
	t.Helper()
	for _, n := range names {
		if !allowed[n] {
			t.Errorf("%s: %q is not in QEMU's schema", what, n)
		}
	}
}

// TestQEMUSchemaMatchesTypedCommands checks every argument and reply member
// this package names against the running QEMU's own schema, and that the
// schema reply (about 200 KiB) is read whole.
func TestQEMUSchemaMatchesTypedCommands(t *testing.T) {
	m, _ := startQEMU(t, qemuConfig{})
	ctx := testContext(t)
	raw, err := m.Execute(ctx, "query-qmp-schema", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) <= 64<<10 {
		t.Errorf("query-qmp-schema reply is %d bytes; expected more than 64 KiB", len(raw))
	}
	t.Logf("query-qmp-schema: %d bytes", len(raw))
	s, err := m.QueryQMPSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}

	argsOf := func(cmd, tag string) map[string]bool {
		members, ok := s.CommandArgs(cmd, tag)
		if !ok {
			t.Fatalf("schema has no command %s (variant %q)", cmd, tag)
		}
		return memberSet(members)
	}
	union := func(sets ...map[string]bool) map[string]bool {
		all := map[string]bool{}
		for _, set := range sets {
			for k := range set {
				all[k] = true
			}
		}
		return all
	}

	assertSubset(t, "device_add", jsonNames(qmp.Device{}), argsOf("device_add", ""))
	assertSubset(t, "netdev_add tap", append(jsonNames(qmp.NetdevTap{}), "type"), argsOf("netdev_add", "tap"))
	assertSubset(t, "blockdev-add", jsonNames(qmp.BlockdevOptions{}), union(argsOf("blockdev-add", "file"), argsOf("blockdev-add", "qcow2")))
	assertSubset(t, "blockdev-add null-co", []string{"size", "read-zeroes"}, argsOf("blockdev-add", "null-co"))
	assertSubset(t, "blockdev-add cache", jsonNames(qmp.BlockdevCache{}), objectMembers(t, s, memberType(t, s, mustArgType(t, s, "blockdev-add"), "cache")))
	assertSubset(t, "migrate", jsonNames(qmp.MigrateOptions{}), argsOf("migrate", ""))
	assertSubset(t, "migrate-set-parameters", jsonNames(qmp.MigrateParameters{}), argsOf("migrate-set-parameters", ""))
	for cmd, names := range map[string][]string{
		"blockdev-del":             {"node-name"},
		"device_del":               {"id"},
		"netdev_del":               {"id"},
		"migrate-incoming":         {"uri"},
		"migrate-set-capabilities": {"capabilities"},
		"getfd":                    {"fdname"},
		"closefd":                  {"fdname"},
		"human-monitor-command":    {"command-line"},
	} {
		assertSubset(t, cmd, names, argsOf(cmd, ""))
	}
	for _, cmd := range []string{"query-status", "query-version", "cont", "stop", "system_powerdown", "system_reset", "quit", "migrate_cancel", "query-migrate", "query-commands", "query-qmp-schema"} {
		if _, ok := s.CommandArgs(cmd, ""); !ok {
			t.Errorf("schema has no command %s", cmd)
		}
	}

	status := mustRetType(t, s, "query-status")
	assertSubset(t, "query-status reply", jsonNames(qmp.StatusInfo{}), objectMembers(t, s, status))
	runStates := enumValues(t, s, memberType(t, s, status, "status"))
	assertSubset(t, "run states", []string{
		string(qmp.StateDebug), string(qmp.StateInMigrate), string(qmp.StateInternalError), string(qmp.StateIOError),
		string(qmp.StatePaused), string(qmp.StatePostMigrate), string(qmp.StatePrelaunch), string(qmp.StateFinishMigrate),
		string(qmp.StateRestoreVM), string(qmp.StateRunning), string(qmp.StateSaveVM), string(qmp.StateShutdown),
		string(qmp.StateSuspended), string(qmp.StateWatchdog), string(qmp.StateGuestPanicked), string(qmp.StateColo),
	}, toSet(runStates))

	migrate := mustRetType(t, s, "query-migrate")
	assertSubset(t, "query-migrate reply", jsonNames(qmp.MigrationInfo{}), objectMembers(t, s, migrate))
	assertSubset(t, "query-migrate ram", jsonNames(qmp.MigrationStats{}), objectMembers(t, s, memberType(t, s, migrate, "ram")))
	assertSubset(t, "migration states", []string{
		string(qmp.MigrationNone), string(qmp.MigrationSetup), string(qmp.MigrationCancelling), string(qmp.MigrationCancelled),
		string(qmp.MigrationActive), string(qmp.MigrationPostcopyActive), string(qmp.MigrationPostcopyPaused),
		string(qmp.MigrationCompleted), string(qmp.MigrationFailed), string(qmp.MigrationPreSwitchover),
		string(qmp.MigrationDevice), string(qmp.MigrationWaitUnplug),
	}, toSet(enumValues(t, s, memberType(t, s, migrate, "status"))))

	capsArray, _ := s.Lookup(memberType(t, s, mustArgType(t, s, "migrate-set-capabilities"), "capabilities"))
	capStatus := capsArray.ElementType
	assertSubset(t, "migrate-set-capabilities entry", jsonNames(qmp.MigrationCapabilityStatus{}), objectMembers(t, s, capStatus))
	assertSubset(t, "migration capabilities", []string{
		string(qmp.CapXBZRLE), string(qmp.CapAutoConverge), string(qmp.CapEvents), string(qmp.CapPostcopyRAM),
		string(qmp.CapReturnPath), string(qmp.CapPauseBeforeSwitchover), string(qmp.CapMultifd), string(qmp.CapZeroCopySend),
	}, toSet(enumValues(t, s, memberType(t, s, capStatus, "capability"))))

	params := mustArgType(t, s, "migrate-set-parameters")
	assertSubset(t, "migrate-set-parameters", jsonNames(qmp.MigrateParameters{}), objectMembers(t, s, params))
	assertSubset(t, "multifd compressions", []string{"none", "zstd"}, toSet(enumValues(t, s, memberType(t, s, params, "multifd-compression"))))

	yanks, _ := s.Lookup(memberType(t, s, mustArgType(t, s, "yank"), "instances"))
	yankType := memberType(t, s, yanks.ElementType, "type")
	assertSubset(t, "yank instance types", []string{"block-node"}, toSet(enumValues(t, s, yankType)))

	commands, _ := s.Lookup(mustRetType(t, s, "query-commands"))
	assertSubset(t, "query-commands entry", jsonNames(qmp.CommandInfo{}), objectMembers(t, s, commands.ElementType))

	for _, ev := range []string{
		qmp.EventShutdown, qmp.EventPowerdown, qmp.EventReset, qmp.EventStop, qmp.EventResume, qmp.EventSuspend,
		qmp.EventWakeup, qmp.EventDeviceDeleted, qmp.EventGuestPanicked, qmp.EventMigration, qmp.EventMigrationPass,
		qmp.EventBlockIOError,
	} {
		if info, ok := s.Lookup(ev); !ok || info.MetaType != "event" {
			t.Errorf("schema has no event %s", ev)
		}
	}

	// Optional members are recognised (their "default" is null).
	members, _ := s.CommandArgs("device_add", "")
	i := slices.IndexFunc(members, func(m qmp.SchemaMember) bool { return m.Name == "bus" })
	j := slices.IndexFunc(members, func(m qmp.SchemaMember) bool { return m.Name == "driver" })
	if i < 0 || j < 0 || !members[i].Optional || members[j].Optional {
		t.Errorf("device_add members %+v: want optional bus, mandatory driver", members)
	}
}

func mustArgType(t *testing.T, s *qmp.Schema, cmd string) string {
	t.Helper()
	info, ok := s.Lookup(cmd)
	if !ok {
		t.Fatalf("schema has no command %s", cmd)
	}
	return info.ArgType
}

func mustRetType(t *testing.T, s *qmp.Schema, cmd string) string {
	t.Helper()
	info, ok := s.Lookup(cmd)
	if !ok {
		t.Fatalf("schema has no command %s", cmd)
	}
	return info.RetType
}

func toSet(values []string) map[string]bool {
	set := make(map[string]bool, len(values))
	for _, v := range values {
		set[v] = true
	}
	return set
}
