package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// The guest agent's endpoints: what the launcher's agent answers, in KubeVirt's shapes. A VMI
// whose agent is not connected gets a 409 (the launcher's refusal).

func (s *Server) guestOSInfo(w http.ResponseWriter, r *http.Request) {
	guestQuery(s, w, r, "guestosinfo", func(ctx context.Context, c *launcher.Client) (any, error) {
		info, err := c.GuestInfo(ctx)
		if err != nil {
			return nil, err
		}
		out := sub.VirtualMachineInstanceGuestAgentInfo{GAVersion: info.Version, Hostname: info.Hostname,
			OS: osInfo(info.OS), UserList: users(info.Users), FSInfo: sub.FileSystemInfo{Filesystems: filesystems(info.Filesystems)},
			FSFreezeStatus: info.FSFreezeStatus}
		for _, name := range info.SupportedCommands {
			out.SupportedCommands = append(out.SupportedCommands, sub.GuestAgentCommand{Name: name, Enabled: true})
		}
		return out, nil
	})
}

func (s *Server) userList(w http.ResponseWriter, r *http.Request) {
	guestQuery(s, w, r, "userlist", func(ctx context.Context, c *launcher.Client) (any, error) {
		us, err := c.GuestUsers(ctx)
		return sub.VirtualMachineInstanceGuestOSUserList{Items: users(us)}, err
	})
}

func (s *Server) fileSystemList(w http.ResponseWriter, r *http.Request) {
	guestQuery(s, w, r, "filesystemlist", func(ctx context.Context, c *launcher.Client) (any, error) {
		fss, err := c.GuestFilesystems(ctx)
		return sub.VirtualMachineInstanceFileSystemList{Items: filesystems(fss)}, err
	})
}

func (s *Server) freeze(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, "freeze", func(c *launcher.Client, ctx context.Context) error {
		_, err := c.FSFreeze(ctx, "freeze")
		return err
	})
}

func (s *Server) unfreeze(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, "unfreeze", func(c *launcher.Client, ctx context.Context) error {
		_, err := c.FSFreeze(ctx, "thaw")
		return err
	})
}

// guestQuery runs one guest agent query through the VMI's launcher and answers its result as JSON.
func guestQuery(s *Server, w http.ResponseWriter, r *http.Request, name string, call func(context.Context, *launcher.Client) (any, error)) {
	_, _, out, ok := s.callLauncher(w, r, name, call)
	if !ok {
		return
	}
	body, err := json.Marshal(out)
	if err != nil {
		fail(w, apierrors.NewInternalError(fmt.Errorf("encode the %s answer: %w", name, err)))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func osInfo(o protocol.GuestOSInfo) v1alpha1.VirtualMachineInstanceGuestOSInfo {
	return v1alpha1.VirtualMachineInstanceGuestOSInfo{Name: o.Name, KernelRelease: o.KernelRelease, Version: o.Version,
		PrettyName: o.PrettyName, VersionID: o.VersionID, KernelVersion: o.KernelVersion, Machine: o.Machine, ID: o.ID}
}

func users(us []protocol.GuestUser) []sub.GuestOSUser {
	out := []sub.GuestOSUser{}
	for _, u := range us {
		out = append(out, sub.GuestOSUser{UserName: u.UserName, Domain: u.Domain, LoginTime: u.LoginTime})
	}
	return out
}

func filesystems(fss []protocol.GuestFilesystem) []sub.FileSystem {
	out := []sub.FileSystem{}
	for _, f := range fss {
		fs := sub.FileSystem{DiskName: f.DiskName, MountPoint: f.MountPoint, FileSystemType: f.FileSystemType,
			UsedBytes: int(f.UsedBytes), TotalBytes: int(f.TotalBytes)}
		for _, d := range f.Disk {
			fs.Disk = append(fs.Disk, sub.FileSystemDisk{Serial: d.Serial, BusType: d.BusType})
		}
		out = append(out, fs)
	}
	return out
}
