-- Scans read by OCR (issue 61). While a scan is read the job shows "reading page 12 of 40":
-- `reading_page` is the page being read (of `stage_pages`). Once read, `scan_report` says which
-- pages OCR read, with what confidence, and which it skipped (page numbers and confidences
-- only: none of the document's words).
ALTER TABLE jobs
    ADD COLUMN reading_page integer,
    ADD COLUMN scan_report jsonb;
