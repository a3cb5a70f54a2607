//! One parquet file of a Hugging Face dataset and the reading of its images' bytes;
//! `parquet.rs` finds the files and their rows.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use parquet::column::reader::ColumnReader;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::RowGroupReader;
use parquet::file::serialized_reader::SerializedRowGroupReader;

/// One parquet file of a dataset, with what reading an image needs.
#[derive(Debug)]
pub struct ParquetFile {
    pub(super) path: PathBuf,
    pub(super) meta: Arc<ParquetMetaData>,
    /// Leaf column index of `image.bytes`.
    pub(super) bytes: usize,
}

impl ParquetFile {
    /// Where row `row` of row group `group` is, for reports.
    pub(super) fn describe(&self, group: u32, row: u32, name: &str) -> String {
        let before: i64 = self.meta.row_groups()[..group as usize]
            .iter()
            .map(|g| g.num_rows())
            .sum();
        format!(
            "{}[row {}]:{name}",
            self.path.display(),
            before + i64::from(row)
        )
    }

    /// The image bytes of row `row` of row group `group`.
    pub(super) fn read(&self, group: u32, row: u32) -> std::io::Result<Vec<u8>> {
        self.read_rows(group, &[row]).pop().expect("one row asked")
    }

    /// The image bytes of `rows` (ascending) of row group `group`, in one pass over its pages:
    /// each page is decompressed once for all the rows it holds.
    pub(super) fn read_rows(&self, group: u32, rows: &[u32]) -> Vec<std::io::Result<Vec<u8>>> {
        let mut column = match self.column(group) {
            Ok(c) => c,
            Err(e) => {
                return rows
                    .iter()
                    .map(|_| Err(std::io::Error::other(e.to_string())))
                    .collect()
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        let mut next = 0;
        for &row in rows {
            let got = column.skip_records((row - next) as usize).and_then(|_| {
                let (mut defs, mut values) = (Vec::new(), Vec::new());
                column.read_records(1, Some(&mut defs), None, &mut values)?;
                Ok(values.pop())
            });
            next = row + 1;
            let image = match got {
                Ok(Some(v)) => Ok(v.data().to_vec()),
                Ok(None) => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the row has no image bytes (null)",
                )),
                Err(e) => {
                    // The reader's place is lost: this and every later row fail alike.
                    let e = e.to_string();
                    out.resize_with(rows.len(), || Err(std::io::Error::other(e.clone())));
                    break;
                }
            };
            out.push(image);
        }
        out
    }

    /// A reader of the `image.bytes` column of row group `group`.
    pub(super) fn column(
        &self,
        group: u32,
    ) -> parquet::errors::Result<
        parquet::column::reader::ColumnReaderImpl<parquet::data_type::ByteArrayType>,
    > {
        let file = File::open(&self.path)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
        let g = group as usize;
        let props = Arc::new(ReaderProperties::builder().build());
        let reader = SerializedRowGroupReader::new(
            Arc::new(file),
            self.meta.row_group(g),
            self.meta.page_index_for_row_group(g),
            props,
        )?;
        match reader.get_column_reader(self.bytes)? {
            ColumnReader::ByteArrayColumnReader(c) => Ok(c),
            _ => Err(parquet::errors::ParquetError::General(
                "image.bytes is not a binary column".into(),
            )),
        }
    }
}
