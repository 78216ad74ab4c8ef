from django.urls import path

from . import views

urlpatterns = [
    path("files", views.files_root, name="files"),
    path("files/<str:file_id>", views.file_detail, name="file-detail"),
    path("files/<str:file_id>/content", views.file_content, name="file-content"),
    path("batches", views.batches_root, name="batches"),
    path("batches/<str:batch_id>", views.batch_detail, name="batch-detail"),
    path("batches/<str:batch_id>/cancel", views.batch_cancel, name="batch-cancel"),
]
