package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/qvirt/qvirt/machine"
)

// DefaultOVMFDir is where Debian's ovmf package installs its builds.
const DefaultOVMFDir = "/usr/share/OVMF"

// EFIVarsFile is the name of an EFI machine's variable store (NVRAM) in the scratch directory, or
// in the state directory when the variables persist (machine.State).
const EFIVarsFile = machine.EFIVarsFile

// OVMFFiles names the OVMF build a machine runs, in Debian's ovmf package: the 4 MiB flash
// layout; for Secure Boot the build that needs SMM, with a variables template that has
// Microsoft's keys enrolled (the keys distributions' shims are signed with) and Secure Boot on.
func OVMFFiles(secureBoot bool) (code, varsTemplate string) {
	if secureBoot {
		return "OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.ms.fd"
	}
	return "OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd"
}

// resolveEFI finds OVMF's code and variables template for efi under OVMFDir and gives the
// machine its own variable store in dir, a copy of the template. An existing store is kept: the
// variables the guest wrote last as long as dir, the launcher's scratch directory (the instance's
// life) or the VM's state directory (the VM's). The template itself is only ever read.
func (h HostResolver) resolveEFI(efi *machine.EFI, dir string) (code, vars string, ferr *machine.FieldError) {
	p := machinePath.Child("firmware", "efi")
	if efi.SecureBoot {
		p = p.Child("secureBoot")
	}
	ovmf := h.OVMFDir
	if ovmf == "" {
		ovmf = DefaultOVMFDir
	}
	codeName, tmplName := OVMFFiles(efi.SecureBoot)
	code, tmpl := filepath.Join(ovmf, codeName), filepath.Join(ovmf, tmplName)
	for _, f := range []string{code, tmpl} {
		if err := regularFile(f); err != nil {
			return "", "", machine.Invalid(p, f, fmt.Sprintf("the OVMF firmware file is missing (%v): install Debian's ovmf package on the node", err))
		}
	}
	vars = filepath.Join(dir, EFIVarsFile)
	if err := copyOnce(tmpl, vars); err != nil {
		return "", "", machine.Invalid(p, vars, fmt.Sprintf("create the EFI variable store from %s: %v", tmpl, err))
	}
	return code, vars, nil
}

func regularFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// copyOnce copies src to dst (mode 0600) unless dst exists already with src's size; a dst of
// another size (a store made from another build) is an error, not something to overwrite. The
// copy is written under a temporary name and renamed, so dst is never half written.
func copyOnce(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	switch have, err := os.Stat(dst); {
	case err == nil && have.Size() == st.Size():
		return nil
	case err == nil:
		return fmt.Errorf("%s exists with %d bytes, the template has %d", dst, have.Size(), st.Size())
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".efi-vars-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
