package main

import (
	"fmt"
	"io"
	"os"
)

// maxInputFile is the largest policy or rule file the commands read: the
// 1 MiB that the policy file's parser and the fault rule parser allow.
const maxInputFile = 1 << 20

// readInputFile reads the policy or rule file at path, refusing what is not
// a regular file (a FIFO would hang the command, a device such as
// /dev/zero never ends) and reading at most maxInputFile bytes, so memory
// follows the limit, never the file.
func readInputFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v); want a file of at most %d bytes", path, st.Mode().Type(), maxInputFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file once opened; want a file of at most %d bytes", path, maxInputFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxInputFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxInputFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxInputFile)
	}
	return data, nil
}
