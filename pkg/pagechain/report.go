package pagechain

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ReportFile is the file in an image directory that says what its deduplication did: the shim
// writes it once Dedup is done or was not done, so that tools and tests see when the directory
// has its final form.
const ReportFile = "pagechain.json"

// Report is ReportFile's content.
type Report struct {
	// Parent is the checkpoint whose images the directory was deduplicated against.
	Parent string `json:"parent,omitempty"`
	// Skipped says why the directory stays a full dump.
	Skipped string `json:"skipped,omitempty"`
	Result
	// Compressed is what Compress did after the deduplication.
	Compressed Compressed `json:"compressed"`
	TookMs     int64      `json:"tookMs"`
}

// WriteReport writes r into dir atomically.
func WriteReport(dir string, r Report) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(dir, ReportFile), append(data, '\n')); err != nil {
		return fmt.Errorf("write %s: %w", ReportFile, err)
	}
	return nil
}

// ReadReport reads dir's ReportFile.
func ReadReport(dir string) (Report, error) {
	var r Report
	data, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(data, &r)
}
