// Attached images become data URLs, scaled down first: they are sent with every later
// turn of the conversation and kept in localStorage, whose space is small.
const MAX_SIDE = 1024;
const MAX_FILE_BYTES = 20 * 1024 * 1024; // the server's default --max-image-mb

async function scaled(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(bitmap.width * scale));
  canvas.height = Math.max(1, Math.round(bitmap.height * scale));
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  // PNG keeps small images exact; large ones go as JPEG to stay small.
  const png = canvas.toDataURL("image/png");
  return png.length < 400_000 ? png : canvas.toDataURL("image/jpeg", 0.9);
}

export async function attachImages(files) {
  const images = [];
  const errors = [];
  for (const file of files) {
    if (file.size > MAX_FILE_BYTES) {
      errors.push(`${file.name} is larger than 20 MiB.`);
      continue;
    }
    try {
      images.push(await scaled(file));
    } catch {
      errors.push(`${file.name} could not be read as an image.`);
    }
  }
  return { images, errors };
}
