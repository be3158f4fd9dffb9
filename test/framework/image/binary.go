package image

import (
	"bytes"
	"debug/elf"
	"fmt"
)

// elfArch maps an ELF machine to the GOARCH that produces it. Only the
// architectures Kubernetes nodes commonly run are listed; 32-bit ARM is
// left out because its variant (GOARM) cannot be read back from the binary
// and a wrong variant in the image platform makes pulls pick the wrong one.
var elfArch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_PPC64:   "ppc64le",
	elf.EM_S390:    "s390x",
	elf.EM_RISCV:   "riscv64",
}

// staticLinuxArch returns the GOARCH of a static Linux executable, or why
// the binary cannot run in a FROM-scratch image. The platform comes from the
// binary itself, so the image can never claim an architecture its
// entrypoint was not built for.
func staticLinuxArch(path string, data []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("binary %s is not a Linux ELF executable (%v): build it with GOOS=linux", path, err)
	}
	defer func() { _ = f.Close() }()
	// Go's linker marks FreeBSD binaries in the ELF header; Linux ones carry
	// no OS ABI.
	if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return "", fmt.Errorf("binary %s is built for OS ABI %s, not Linux: build it with GOOS=linux", path, f.OSABI)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("binary %s is an ELF %s, not an executable", path, f.Type)
	}
	// The image has no libc and no dynamic loader: a binary that needs one
	// starts with "no such file or directory" although the file is there.
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp := make([]byte, p.Filesz)
			if _, err := p.ReadAt(interp, 0); err != nil {
				return "", fmt.Errorf("binary %s: reading its ELF interpreter: %w", path, err)
			}
			return "", fmt.Errorf("binary %s is dynamically linked (interpreter %s) but the image has no loader or libc: build it with CGO_ENABLED=0",
				path, string(bytes.TrimRight(interp, "\x00")))
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return "", fmt.Errorf("binary %s needs shared libraries %v but the image has none: build it with CGO_ENABLED=0", path, libs)
	}
	arch, ok := elfArch[f.Machine]
	if !ok || (f.Machine == elf.EM_PPC64 && f.Data != elf.ELFDATA2LSB) || f.Class != elf.ELFCLASS64 {
		return "", fmt.Errorf("binary %s is for ELF machine %s (%s, %s), which this image builder does not support", path, f.Machine, f.Class, f.Data)
	}
	return arch, nil
}
